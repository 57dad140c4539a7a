#include "accelerate/consistency_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem::detail {
namespace {

using FingerprintJson = nlohmann::ordered_json;

void flatten(const FingerprintJson& node, const std::string& prefix, FingerprintEntries& out) {
  if (node.is_object() && !node.empty()) {
    for (const auto& [key, value] : node.items()) {
      flatten(value, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  out.emplace_back(prefix, node.dump());
}

bool per_rank_key(const std::string& key) {
  // machine_rank is the node's index; gpu_ids names the node's own devices;
  // source is where this node found its file; warnings quote that path.
  static const char* const kPrefixes[] = {"machine_rank", "launch.gpu_ids", "source.", "warnings"};
  for (const char* prefix : kPrefixes) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::string tensor_signature(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{}{}", c10::toString(t.scalar_type()), c10::str(t.sizes()));
}

// "rank 3", "ranks 0,1", "ranks 0-5,7".
std::string format_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j >= i + 2 ? fmt::format("{}-{}", ranks[i], ranks[j])
                      : j == i + 1 ? fmt::format("{},{}", ranks[i], ranks[j])
                                   : std::to_string(ranks[i]);
    i = j + 1;
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

// "V1 on ranks 0,1 but V2 on rank 2 and V3 on rank 3"; values in order of
// their first rank.
std::string describe_values(const std::vector<std::string>& value_by_rank) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(value_by_rank.size()); ++r) {
    auto& list = ranks[value_by_rank[r]];
    if (list.empty()) order.push_back(value_by_rank[r]);
    list.push_back(r);
  }
  std::string out;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 1) out += " but ";
    if (i > 1) out += " and ";
    out += order[i] + " on " + format_ranks(ranks[order[i]]);
  }
  return out;
}

std::vector<uint8_t> hash_bytes(uint64_t hash) {
  std::vector<uint8_t> bytes(sizeof(hash));
  std::memcpy(bytes.data(), &hash, sizeof(hash));
  return bytes;
}

std::string serialize(const FingerprintEntries& entries) {
  // JSON keeps keys and values with any character intact.
  FingerprintJson list = FingerprintJson::array();
  for (const auto& [key, value] : entries) list.push_back({key, value});
  return list.dump();
}

FingerprintEntries deserialize(const std::string& text) {
  FingerprintEntries entries;
  for (const auto& item : FingerprintJson::parse(text)) {
    entries.emplace_back(item.at(0).get<std::string>(), item.at(1).get<std::string>());
  }
  return entries;
}

}  // namespace

FingerprintEntries config_fingerprint(const Config& config, int world_size) {
  FingerprintEntries all;
  flatten(FingerprintJson::parse(resolved_config_json(config, world_size)), "", all);
  FingerprintEntries kept;
  for (auto& entry : all) {
    if (!per_rank_key(entry.first)) kept.push_back(std::move(entry));
  }
  return kept;
}

FingerprintEntries model_fingerprint(const torch::nn::Module& model) {
  FingerprintEntries entries;
  // Ties are part of the structure: a rank that ties the head to the
  // embedding and one that does not train different models.
  for (const auto& item : unique_named_parameters(model)) {
    std::string value = tensor_signature(item.tensor);
    if (!item.tensor.requires_grad()) value += " frozen";
    entries.emplace_back("parameter " + item.name, std::move(value));
    for (const auto& alias : item.aliases) {
      entries.emplace_back("parameter " + alias, "tied to " + item.name);
    }
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    entries.emplace_back("buffer " + item.key(), tensor_signature(item.value()));
  }
  return entries;
}

uint64_t fingerprint_hash(const FingerprintEntries& entries) {
  uint64_t hash = 14695981039346656037ull;
  auto mix = [&hash](const std::string& text) {
    // The length first, so ("ab", "c") and ("a", "bc") differ.
    const uint64_t size = text.size();
    for (size_t i = 0; i < sizeof(size); ++i) {
      hash = (hash ^ ((size >> (8 * i)) & 0xff)) * 1099511628211ull;
    }
    for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  };
  for (const auto& [key, value] : entries) {
    mix(key);
    mix(value);
  }
  return hash;
}

std::string describe_rank_differences(const std::vector<FingerprintEntries>& per_rank,
                                      const DiffWording& wording) {
  const int world = static_cast<int>(per_rank.size());
  std::vector<std::map<std::string, std::string>> lookup(world);
  std::vector<std::string> keys;  // rank 0's order, then keys first seen later
  std::set<std::string> seen;
  for (int r = 0; r < world; ++r) {
    for (const auto& [key, value] : per_rank[r]) {
      lookup[r].emplace(key, value);
      if (seen.insert(key).second) keys.push_back(key);
    }
  }
  std::vector<std::string> diffs;
  for (const auto& key : keys) {
    std::vector<std::string> values(world);
    bool differs = false;
    for (int r = 0; r < world; ++r) {
      auto it = lookup[r].find(key);
      values[r] = it == lookup[r].end() ? "(absent)" : it->second;
      differs |= values[r] != values[0];
    }
    if (differs) diffs.push_back(key + wording.separator + describe_values(values));
  }
  if (diffs.empty()) {
    // Same entries, different order (e.g. modules registered in another
    // order): DDP's buckets and ZeRO's shards depend on it.
    for (int r = 1; r < world; ++r) {
      if (per_rank[r] == per_rank[0]) continue;
      const size_t n = std::min(per_rank[r].size(), per_rank[0].size());
      size_t i = 0;
      while (i + 1 < n && per_rank[r][i] == per_rank[0][i]) ++i;
      return fmt::format("{} differs across ranks: the same entries are in a different order; "
                         "entry {} is {} on rank 0 but {} on rank {}; {}",
                         wording.what, i, per_rank[0][i].first, per_rank[r][i].first, r,
                         wording.advice);
    }
    return "";
  }
  std::string list;
  for (size_t i = 0; i < diffs.size() && i < wording.max_keys; ++i) {
    list += (i > 0 ? "; " : "") + diffs[i];
  }
  if (diffs.size() > wording.max_keys) {
    list += fmt::format("; ... and {} more", diffs.size() - wording.max_keys);
  }
  return fmt::format("{} differs across ranks: {}; {}", wording.what, list, wording.advice);
}

void check_same_across_ranks(ProcessGroup& pg, const FingerprintEntries& entries,
                             const DiffWording& wording) {
  if (pg.world_size() <= 1) return;
  const auto hashes = pg.all_gather_bytes(hash_bytes(fingerprint_hash(entries)));
  bool equal = true;
  for (const auto& hash : hashes) equal &= hash == hashes.front();
  if (equal) return;
  // Every rank saw the same hashes, so all of them gather the lists.
  const auto texts = pg.all_gather_strings(serialize(entries));
  std::vector<FingerprintEntries> per_rank;
  per_rank.reserve(texts.size());
  for (const auto& text : texts) per_rank.push_back(deserialize(text));
  std::string message = describe_rank_differences(per_rank, wording);
  if (message.empty()) {
    message = fmt::format("{} differs across ranks (fingerprint hashes differ, entries do not; "
                          "this is a bug in tandem, please report it); {}",
                          wording.what, wording.advice);
  }
  TANDEM_THROW(UsageError, "{}", message);
}

void check_config_consistency(ProcessGroup& pg, const Config& config) {
  DiffWording wording;
  wording.what = "config";
  wording.separator = ": ";
  wording.advice =
      "check that every node reads the same config file and environment "
      "(TANDEM_CONFIG_FILE, TANDEM_MIXED_PRECISION, TANDEM_GRADIENT_ACCUMULATION_STEPS, "
      "TANDEM_SEED) and that the code passes the same AcceleratorOptions on every rank";
  check_same_across_ranks(pg, config_fingerprint(config, pg.world_size()), wording);
}

void check_model_consistency(ProcessGroup& pg, const torch::nn::Module& model) {
  DiffWording wording;
  wording.what = "model";
  wording.separator = " is ";
  wording.advice =
      "every rank must build the same model (same code, constructor arguments and frozen "
      "parameters) before prepare(); check for rank-dependent branches in the model code";
  wording.max_keys = 3;
  check_same_across_ranks(pg, model_fingerprint(model), wording);
}

}  // namespace tandem::detail
