// The key tables' reader: for_each_key() and each key's disposition
// (yaml_reader.h's KeyTable and KeyNote), and the check that an implemented
// key's value was read.

#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

#include "config/did_you_mean.h"
#include "config/yaml_reader.h"
#include "tandem/core/error.h"

namespace tandem::config_detail {

void expect_map(const Value& value, const std::string& fix) {
  if (value.is_null() || value.is_map()) return;
  value.fail("expected a mapping of keys, got " + value.describe(), fix);
}

const char* to_string(KeyDisposition disposition) {
  switch (disposition) {
    case KeyDisposition::kImplemented: return "implemented";
    case KeyDisposition::kWarn: return "warn";
    case KeyDisposition::kRefuse: return "refuse";
  }
  return "?";
}

std::vector<KeyNote> notes_for(const std::vector<std::string>& keys, const std::string& note,
                               const std::vector<std::string>& quiet,
                               const std::function<void(const Value&)>& check) {
  std::vector<KeyNote> out;
  for (const auto& key : keys) out.push_back({key, note, quiet, check});
  return out;
}

void check_bool(const Value& value) { (void)value.as_bool(); }

std::function<void(const Value&)> check_whole(int64_t min, bool auto_allowed) {
  return [min, auto_allowed](const Value& value) {
    if (auto_allowed && value.is_auto()) return;
    (void)value.as_int(min);
  };
}

namespace {

bool note_names_key(const std::string& pattern, const std::string& key) {
  if (!pattern.empty() && pattern.back() == '*') {
    return key.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  }
  return pattern == key;
}

const KeyNote* find_key_note(const std::vector<KeyNote>& notes, const std::string& key) {
  for (const auto& note : notes) {
    if (note_names_key(note.key, key)) return &note;
  }
  return nullptr;
}

std::string quiet_lowercase(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Whether `node` is one of `quiet`'s values (KeyNote). A mapping whose
// every value is quiet is quiet too, when "{}" is ({ipex: false}).
bool is_quiet(const YAML::Node& node, const std::vector<std::string>& quiet) {
  for (const auto& q : quiet) {
    if (q == "null" && (!node.IsDefined() || node.IsNull())) return true;
    if (q == "[]" && node.IsSequence() && node.size() == 0) return true;
    if (node.IsScalar() && quiet_lowercase(node.Scalar()) == quiet_lowercase(q)) return true;
    if (q == "{}" && node.IsMap()) {
      bool all = true;
      for (auto it = node.begin(); it != node.end() && all; ++it) all = is_quiet(it->second, quiet);
      if (all) return true;
    }
  }
  return false;
}

}  // namespace

void check_keys_read(const ReadContext& ctx) {
  for (const auto& path : ctx.implemented_keys) {
    if (ctx.read_paths.count(path)) continue;
    ctx.config->warnings.push_back(fmt::format(
        "{}: '{}' was accepted but no reader looked at its value, so it has no effect; this is "
        "a tandem bug, please report it",
        ctx.name, path));
  }
  ctx.implemented_keys.clear();
}

void for_each_key(const Value& map, const KeyTable& table,
                  const std::function<void(const std::string&, const Value&)>& visit,
                  const UnknownKeyHint& hint) {
  expect_map(map, "write its settings as `key: value` entries (a JSON object)");
  if (map.is_null()) return;
  const ReadContext& ctx = map.context();
  std::map<std::string, YAML::Mark> seen;
  for (auto it = map.node().begin(); it != map.node().end(); ++it) {
    // A copy (a handle): `it->` yields a temporary pair, and a reference
    // into it dangles after this line (ASan: stack-use-after-scope).
    const YAML::Node key_node = it->first;
    YAML::Mark key_mark = key_node.Mark();
    if (!key_node.IsScalar()) {
      TANDEM_THROW(UsageError, "{}: {}: a key must be a plain name, got a {}; write `name: value`",
                   mark_text(ctx.name, key_mark), map.path(),
                   key_node.IsMap() ? "mapping" : "list");
    }
    const std::string key = key_node.Scalar();
    const std::string path = join_path(map.path(), key);
    auto first = seen.find(key);
    if (first != seen.end()) {
      TANDEM_THROW(UsageError, "{}: {}: given twice (first at line {}); keep one of them",
                   mark_text(ctx.name, key_mark), path, first->second.line + 1);
    }
    seen.emplace(key, key_mark);
    Value value(ctx, it->second, key_mark, path);

    if (std::find(table.read.begin(), table.read.end(), key) != table.read.end()) {
      const YAML::Node raw = it->second;  // a handle: it-> yields a temporary
      const bool auto_value = raw.IsScalar() && raw.Scalar() == "auto";
      if (raw.IsDefined() && !raw.IsNull() && !auto_value) {
        ctx.config->key_locations[path] = value.where();
      }
      ctx.implemented_keys.push_back(path);
      visit(key, value);
      continue;
    }
    if (const KeyNote* note = find_key_note(table.warned, key)) {
      if (note->check && !it->second.IsNull()) note->check(value);
      if (!is_quiet(it->second, note->quiet)) {
        ctx.config->warnings.push_back(
            fmt::format("{}: '{}' {}", mark_text(ctx.name, key_mark), path, note->note));
      }
      continue;
    }
    if (const KeyNote* note = find_key_note(table.refused, key)) {
      if (is_quiet(it->second, note->quiet)) continue;
      TANDEM_THROW(UsageError, "{}: {}: {}", value.where(), path, note->note);
    }

    std::vector<std::string> valid = table.read;
    for (const auto& note : table.warned) valid.push_back(note.key);
    for (const auto& note : table.refused) valid.push_back(note.key);
    std::string guess = closest_candidate(key, valid);
    std::string extra = hint ? hint(key) : "";
    std::string fix = guess.empty()
                          ? "remove it; keys tandem reads here: " + join_alternatives(table.read, "and")
                          : "did you mean '" + guess + "'?";
    TANDEM_THROW(UsageError, "{}: {}: unknown key{}; {}", mark_text(ctx.name, key_mark), path,
                 extra, fix);
  }
}

}  // namespace tandem::config_detail
