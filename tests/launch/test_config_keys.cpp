// The key walk: every key of every dialect that tandem's config readers
// accept (tandem/config/config_keys.h, also `tandem config keys --json`)
// goes through `tandem config check` in a file of its own, and is reported
// as its disposition says: an implemented key with no warning about it (and
// no "no reader looked at its value" report), a warn key in the JSON's
// warnings and on stderr, a refuse key as an error naming it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launch/config_cli_helpers.h"
#include "tandem/config/config.h"
#include "tandem/config/config_keys.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_process;
using testing::tandem_in;
using testing::TempDir;
using testing::write_text;

// Values tried, in order, until the reader accepts one (JSON, which YAML's
// flow syntax reads the same).
const std::vector<std::string> kCandidates = {
    "true", "false", "1", "2", "0", "0.5", "29500", "\"auto\"", "\"static\"", "\"none\"",
    "\"cpu\"", "\"AdamW\"", "\"WarmupLR\"", "\"linear\"", "\"bf16\"", "\"all\"", "\"MULTI_GPU\"",
    "\"LOCAL_MACHINE\"", "\"127.0.0.1\"", "\"pdsh\"", "\"ds.json\"", "[0.9, 0.99]", "{}",
    "\"x\"", "{\"a\": 7}", "12345", "\"TRANSFORMER_BASED_WRAP\"", "null", "[\"USR1\"]"};

// fsdp_config keys that Accelerate accepts only next to others: the others,
// as entries to add to the key's own mapping.
std::string fsdp_prerequisites(const std::string& key) {
  auto ends = [&](const std::string& tail) {
    return key.size() >= tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends("sync_module_states")) return ", \"fsdp_cpu_ram_efficient_loading\": false";
  if (ends("activation_checkpointing_offload")) {
    return ", \"fsdp_version\": 2, \"fsdp_activation_checkpointing\": true";
  }
  return "";
}

// DeepSpeed top-level keys read only next to another: that one, as an entry
// to add to the document.
std::string deepspeed_prerequisites(const std::string& key) {
  // DeepSpeed reads allgather_size only beside the deprecated flag.
  if (key == "allgather_size") return ", \"zero_optimization\": true";
  return "";
}

// The file text that sets `key` (a dotted path) to `value` in `dialect`.
std::string file_with(const ConfigKeyInfo& key, const std::string& value) {
  std::string path = key.key;
  if (!path.empty() && path.back() == '*') path = path.substr(0, path.size() - 1) + "name";
  std::vector<std::string> parts;
  std::stringstream split(path);
  for (std::string part; std::getline(split, part, '.');) parts.push_back(part);
  // Innermost first: {"c": V}, then {"b": {"c": V}}; the optimizer and
  // scheduler params tables need their type.
  std::string inner = value;
  const bool fsdp = key.dialect == "accelerate_yaml" && parts[0] == "fsdp_config";
  for (size_t i = parts.size(); i-- > 1;) {
    std::string entry = "\"" + parts[i] + "\": " + inner;
    if (fsdp && i == parts.size() - 1) entry += fsdp_prerequisites(parts[i]);
    // The stage-3 limits warn below stage 3 (they would change nothing).
    if (i == 1 && parts[0] == "zero_optimization" && parts.size() == 2 &&
        (parts[1].find("prefetch_bucket_size") != std::string::npos ||
         parts[1].find("param_persistence_threshold") != std::string::npos ||
         parts[1].find("max_live_parameters") != std::string::npos)) {
      entry += ", \"stage\": 3";
    }
    // optimizer and scheduler blocks need a type, which picks the params.
    const bool typed_block = parts[i - 1] == "optimizer" || parts[i - 1] == "scheduler";
    if (typed_block && parts[i] != "type") {
      std::string type = key.type;
      if (type.empty()) type = parts[i - 1] == "optimizer" ? "AdamW" : "WarmupLR";
      entry += ", \"type\": \"" + type + "\"";
    }
    inner = "{" + entry + "}";
  }
  if (key.dialect == "deepspeed_json") {
    return "{\"" + parts[0] + "\": " + inner + deepspeed_prerequisites(parts[0]) + "}";
  }
  std::string text = "\"" + parts[0] + "\": " + inner + "\n";
  if (key.dialect == "accelerate_yaml" && parts[0] != "distributed_type") {
    // fsdp_config is read under FSDP only (and ignored with a warning else).
    text = std::string("distributed_type: ") + (fsdp ? "FSDP" : "DEEPSPEED") + "\n" + text;
  }
  return text;
}

bool quiet(const ConfigKeyInfo& key, const std::string& value) {
  std::string text = value;
  if (text.size() >= 2 && text.front() == '"') text = text.substr(1, text.size() - 2);
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  for (const auto& q : key.quiet) {
    std::string lowered = q;
    std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) {
      return static_cast<char>(std::tolower(c));
    });
    if (lowered == text) return true;
  }
  return false;
}

std::string shown(const ConfigKeyInfo& key) {
  return key.dialect + " " + key.key + (key.type.empty() ? "" : " (" + key.type + ")");
}

std::string key_path(const ConfigKeyInfo& key) {
  return key.key.back() == '*' ? key.key.substr(0, key.key.size() - 1) + "name" : key.key;
}

struct WalkCase {
  ConfigKeyInfo key;
  std::string file;
};

TEST(ConfigKeys, EveryKeyOfEveryDialectIsReportedAsItsDispositionSays) {
  TempDir dir;
  write_text(dir.path() + "/ds.json", R"({"zero_optimization": {"stage": 1}})");
  const std::vector<ConfigKeyInfo> keys = config_keys();
  ASSERT_GT(keys.size(), 300u);
  std::vector<WalkCase> accepted, refused;
  int n = 0;
  for (const auto& key : keys) {
    const std::string ext = key.dialect == "deepspeed_json" ? ".json" : ".yaml";
    const std::string file = dir.path() + "/k" + std::to_string(n++) + ext;
    bool placed = false;
    for (const auto& value : kCandidates) {
      if (key.disposition != "implemented" && quiet(key, value)) continue;
      const std::string text = file_with(key, value);
      try {
        const Config config = parse_config_text(text, file, dir.path());
        if (key.disposition == "refuse") continue;  // not this value: try the next
        bool names_key = false;
        for (const auto& w : config.warnings) {
          names_key = names_key || w.find("'" + key_path(key) + "'") != std::string::npos;
          EXPECT_EQ(w.find("no reader looked at its value"), std::string::npos)
              << shown(key) << " = " << value << ": " << w;
        }
        if (key.disposition == "warn" && !names_key) continue;  // a value that asks for nothing
        EXPECT_EQ(names_key, key.disposition == "warn")
            << shown(key) << " = " << value << " is " << key.disposition << ":\n"
            << (config.warnings.empty() ? "" : config.warnings.front());
      } catch (const UsageError& e) {
        if (key.disposition != "refuse") continue;
        if (std::string(e.what()).find(key_path(key)) == std::string::npos) continue;
      }
      write_text(file, text);
      (key.disposition == "refuse" ? refused : accepted).push_back({key, file});
      placed = true;
      break;
    }
    EXPECT_TRUE(placed) << shown(key) << " (" << key.disposition
                        << "): no value tried is reported as its disposition says";
  }

  // The same files through `tandem config check`, in two processes: one
  // JSON line per file.
  auto check = [&](const std::vector<WalkCase>& cases, int expected_code) {
    std::vector<std::string> args = {"config", "check"};
    for (const auto& c : cases) args.push_back(c.file);
    auto r = run_process(tandem_in(dir.path(), args), 120);
    EXPECT_EQ(r.exit_code, expected_code) << r.err.substr(0, 2000);
    std::map<std::string, nlohmann::json> by_file;
    std::stringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      auto json = nlohmann::json::parse(line);
      by_file[json["file"].get<std::string>()] = json;
    }
    for (const auto& c : cases) {
      const std::string path = key_path(c.key);
      ASSERT_TRUE(by_file.count(c.file)) << shown(c.key) << ": no JSON line for " << c.file;
      const nlohmann::json& json = by_file[c.file];
      if (c.key.disposition == "refuse") {
        EXPECT_FALSE(json["valid"].get<bool>()) << shown(c.key);
        EXPECT_NE(json["error"].get<std::string>().find(path), std::string::npos) << shown(c.key);
        continue;
      }
      ASSERT_TRUE(json["valid"].get<bool>()) << shown(c.key) << ": " << json.dump();
      bool in_json = false;
      for (const auto& w : json["config"]["warnings"]) {
        const std::string text = w.get<std::string>();
        in_json = in_json || (text.find(c.file + ":") != std::string::npos &&
                              text.find("'" + path + "'") != std::string::npos);
      }
      const bool on_stderr = r.err.find(c.file + ":") != std::string::npos &&
                             r.err.find("'" + path + "'") != std::string::npos;
      EXPECT_EQ(in_json, c.key.disposition == "warn") << shown(c.key) << " in the JSON";
      if (c.key.disposition == "warn") {
        EXPECT_TRUE(on_stderr) << shown(c.key) << " on stderr";
      }
    }
  };
  check(accepted, 0);
  check(refused, 2);
  std::printf("key walk: %zu keys accepted (implemented or warn), %zu refused\n", accepted.size(),
              refused.size());
}

TEST(ConfigKeys, TheJsonListingHasOneEntryPerKeyAndDialect) {
  TempDir home;
  auto r = run_process(tandem_in(home.path(), {"config", "keys", "--json"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(r.out);
  ASSERT_EQ(json.size(), config_keys().size());
  std::set<std::string> dispositions;
  for (const auto& entry : json) {
    for (const char* field : {"dialect", "key", "disposition", "note"}) {
      EXPECT_TRUE(entry.contains(field)) << entry.dump();
    }
    dispositions.insert(entry["disposition"].get<std::string>());
    if (entry["disposition"] != "implemented") {
      EXPECT_FALSE(entry["note"].get<std::string>().empty()) << entry.dump();
    }
  }
  EXPECT_EQ(dispositions, (std::set<std::string>{"implemented", "refuse", "warn"}));
}

}  // namespace
}  // namespace tandem
