// SafetensorsSet: one file or a Hugging Face index of shards, read as one
// collection of tensors; and the writing side's shard names, split and index.

#include "tandem/checkpoint/safetensors_set.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/safetensors_io.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace safetensors_set {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The file to open for directory `dir` (see the header for the order).
std::string resolve_directory(const std::string& dir) {
  for (const char* name : {kSafetensorsWeightsName, kSafetensorsIndexName}) {
    const std::string candidate = dir + "/" + name;
    if (detail::path_exists(candidate)) return candidate;
  }
  std::vector<std::string> indexes, files;
  std::error_code ec;
  for (const std::string& name : fs::list_directory(dir, ec)) {  // sorted
    if (ends_with(name, ".safetensors.index.json")) indexes.push_back(name);
    if (ends_with(name, ".safetensors")) files.push_back(name);
  }
  if (ec) detail::throw_file_error("listing", dir, ec.value());
  if (indexes.size() == 1) return dir + "/" + indexes.front();
  if (indexes.empty() && files.size() == 1) return dir + "/" + files.front();
  TANDEM_THROW(CheckpointError,
               "'{}' holds no {} and no {}, and {} index file(s) ({}) and {} safetensors file(s) "
               "({}), so which to load is ambiguous; pass the path of the file or index to load",
               dir, kSafetensorsWeightsName, kSafetensorsIndexName, indexes.size(),
               fmt::join(indexes, ", "), files.size(), fmt::join(files, ", "));
}

// True when `file` names a path below the index's directory: relative, with
// no ".." component.
bool stays_inside(const std::string& file) {
  if (file.empty() || file.front() == '/') return false;
  std::size_t start = 0;
  while (start <= file.size()) {
    std::size_t slash = file.find('/', start);
    if (slash == std::string::npos) slash = file.size();
    if (file.compare(start, slash - start, "..") == 0 && slash - start == 2) return false;
    start = slash + 1;
  }
  return true;
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string listed(const std::vector<std::string>& items) {
  return detail::first_items(items, 5);
}

}  // namespace safetensors_set

SafetensorsSet::SafetensorsSet(const std::string& path) {
  using namespace safetensors_set;
  if (!detail::path_exists(path)) {
    TANDEM_THROW(CheckpointError, "'{}' does not exist; give a safetensors file, a {} or the "
                 "directory holding them", path, kSafetensorsIndexName);
  }
  path_ = is_directory(path) ? resolve_directory(path) : path;
  if (ends_with(path_, ".json")) {
    open_index(path_);
  } else {
    open_file(path_);
  }
}

SafetensorsSet::~SafetensorsSet() = default;
SafetensorsSet::SafetensorsSet(SafetensorsSet&&) noexcept = default;
SafetensorsSet& SafetensorsSet::operator=(SafetensorsSet&&) noexcept = default;

void SafetensorsSet::open_file(const std::string& file_path) {
  readers_.push_back(std::make_unique<SafetensorsReader>(file_path));
  for (const auto& entry : readers_.front()->entries()) reader_of_[entry.name] = 0;
  index_entries();
}

void SafetensorsSet::open_index(const std::string& index_path) {
  using namespace safetensors_set;
  indexed_ = true;
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(detail::read_small_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    TANDEM_THROW(CheckpointError, "index '{}' is not valid JSON ({}); regenerate it, or load a "
                 "safetensors file directly", index_path, e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object() ||
      index["weight_map"].empty()) {
    TANDEM_THROW(CheckpointError, "index '{}' has no \"weight_map\" object naming the file of "
                 "each tensor (Hugging Face's {{\"metadata\": {{...}}, \"weight_map\": "
                 "{{\"<tensor>\": \"<file>\"}}}}); regenerate it",
                 index_path);
  }
  const std::string dir = directory_of(index_path);
  std::map<std::string, std::vector<std::string>> tensors_of;  // file -> tensors
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      TANDEM_THROW(CheckpointError, "index '{}': weight_map[\"{}\"] is {}, not a file name; "
                   "regenerate the index", index_path, name, file.dump());
    }
    const std::string shard = file.get<std::string>();
    if (!stays_inside(shard)) {
      TANDEM_THROW(CheckpointError,
                   "index '{}': weight_map[\"{}\"] is \"{}\", which leaves the index's "
                   "directory; shard files must sit next to the index (such as "
                   "\"model-00001-of-00002.safetensors\"): fix or regenerate the index",
                   index_path, name, shard);
    }
    tensors_of[shard].push_back(name);
  }
  std::vector<std::string> missing;
  for (const auto& [shard, names] : tensors_of) {
    if (!detail::path_exists(dir + "/" + shard)) {
      missing.push_back(fmt::format("{} ({} tensor(s), such as '{}')", shard, names.size(),
                                    names.front()));
    }
  }
  if (!missing.empty()) {
    TANDEM_THROW(CheckpointError,
                 "index '{}' names {} file(s) missing from '{}': {}. Copy or download every "
                 "shard next to the index, or regenerate the index",
                 index_path, missing.size(), dir, listed(missing));
  }
  std::vector<std::string> absent;
  int64_t total = 0;
  for (const auto& [shard, names] : tensors_of) {
    const std::size_t r = readers_.size();
    readers_.push_back(std::make_unique<SafetensorsReader>(dir + "/" + shard));
    for (const auto& name : names) {
      const SafetensorsEntry* entry = readers_[r]->find(name);
      if (entry == nullptr) {
        absent.push_back(fmt::format("'{}' -> {}", name, shard));
        continue;
      }
      reader_of_[name] = r;
      total += entry->data_end - entry->data_begin;
    }
  }
  if (!absent.empty()) {
    TANDEM_THROW(CheckpointError,
                 "index '{}' maps {} tensor(s) to files that do not hold them: {}. The index "
                 "does not belong to these shards: regenerate it, or copy the matching shards",
                 index_path, absent.size(), listed(absent));
  }
  // transformers does not check total_size either; a wrong one only hints at a mix-up.
  if (index.contains("metadata") && index["metadata"].is_object() &&
      index["metadata"].contains("total_size") && index["metadata"]["total_size"].is_number() &&
      index["metadata"]["total_size"].get<double>() != static_cast<double>(total)) {
    log_warn("index '{}': metadata.total_size is {} but the tensors it maps hold {} bytes",
             index_path, index["metadata"]["total_size"].dump(), total);
  }
  index_entries();
}

void SafetensorsSet::index_entries() {
  entries_.clear();
  for (std::size_t r = 0; r < readers_.size(); ++r) {
    for (const auto& entry : readers_[r]->entries()) {
      const auto it = reader_of_.find(entry.name);
      if (it != reader_of_.end() && it->second == r) entries_.push_back(&entry);
    }
  }
}

std::vector<std::string> SafetensorsSet::files() const {
  std::vector<std::string> out;
  for (const auto& reader : readers_) out.push_back(reader->path());
  return out;
}

const SafetensorsEntry* SafetensorsSet::find(const std::string& name) const {
  const auto it = reader_of_.find(name);
  return it == reader_of_.end() ? nullptr : readers_[it->second]->find(name);
}

const SafetensorsReader& SafetensorsSet::reader_of(const std::string& name) const {
  const auto it = reader_of_.find(name);
  if (it == reader_of_.end()) {
    TANDEM_THROW(CheckpointError, "'{}' has no tensor '{}' ({} tensors in {} file(s))", path_,
                 name, entries_.size(), readers_.size());
  }
  return *readers_[it->second];
}

at::Tensor SafetensorsSet::read(const std::string& name) const {
  return reader_of(name).read(name);
}

void SafetensorsSet::read_range_into(const std::string& name, int64_t begin,
                                     const at::Tensor& dst) const {
  reader_of(name).read_range_into(name, begin, dst);
}

int64_t SafetensorsSet::bytes_read() const {
  int64_t total = 0;
  for (const auto& reader : readers_) total += reader->bytes_read();
  return total;
}

int64_t parse_byte_size(const std::string& text) {
  auto refuse = [&text]() -> int64_t {
    TANDEM_THROW(UsageError,
                 "'{}' is not a size: write a whole number of bytes with an optional unit, as "
                 "Hugging Face's max_shard_size does: \"2GB\", \"500MB\", \"10KB\" (powers of "
                 "1000), \"1GiB\", \"64MiB\" (powers of 1024), or \"1000\"",
                 text);
  };
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18) return refuse();
  std::string unit = text.substr(digits);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::map<std::string, int64_t> kUnits = {
      {"", 1},          {"b", 1},
      {"kb", 1000},     {"mb", 1000'000},        {"gb", 1000'000'000},
      {"tb", int64_t{1000'000'000'000}},
      {"kib", 1 << 10}, {"mib", 1 << 20},        {"gib", int64_t{1} << 30},
      {"tib", int64_t{1} << 40}};
  const auto it = kUnits.find(unit);
  if (it == kUnits.end()) return refuse();
  const int64_t count = std::stoll(text.substr(0, digits));
  if (count == 0 || count > std::numeric_limits<int64_t>::max() / it->second) return refuse();
  return count * it->second;
}

std::string safetensors_shard_file_name(int index, int count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index, count);
}

std::vector<std::vector<std::size_t>> plan_safetensors_shards(const std::vector<int64_t>& bytes,
                                                              int64_t max_shard_bytes) {
  TANDEM_CHECK_ARG(max_shard_bytes > 0, "plan_safetensors_shards: max_shard_bytes must be > 0");
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  int64_t filled = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_shard_bytes) {
      shards.push_back({i});  // alone, and the current shard goes on filling
      continue;
    }
    if (!current.empty() && filled + bytes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
    current.push_back(i);
    filled += bytes[i];
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

SafetensorsSetPlan plan_safetensors_set(const std::vector<SafetensorsSpec>& specs,
                                        int64_t max_shard_bytes) {
  std::vector<int64_t> bytes;
  for (const auto& spec : specs) {
    int64_t n = static_cast<int64_t>(c10::elementSize(spec.dtype));
    for (int64_t d : spec.shape) n *= d;
    bytes.push_back(n);
  }
  SafetensorsSetPlan plan;
  plan.shards = plan_safetensors_shards(bytes, max_shard_bytes);
  const int count = static_cast<int>(plan.shards.size());
  for (int k = 0; k < count; ++k) {
    plan.files.push_back(count == 1 ? std::string(kSafetensorsWeightsName)
                                    : safetensors_shard_file_name(k + 1, count));
    for (std::size_t i : plan.shards[static_cast<std::size_t>(k)]) {
      plan.weight_map[specs[i].name] = plan.files.back();
      plan.total_size += bytes[i];
    }
  }
  return plan;
}

std::string safetensors_index_json(const std::map<std::string, std::string>& weight_map,
                                   int64_t total_size) {
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                          {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

}  // namespace tandem
