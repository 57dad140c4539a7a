#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "checkpoint/checkpoint_fs.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"

namespace tandem {

CheckpointReader::CheckpointReader(const std::string& dir, const std::string& tag) {
  if (tag.empty()) {
    std::optional<std::string> latest = latest_checkpoint_tag(dir);
    if (!latest) {
      TANDEM_THROW(CheckpointError,
                   "no checkpoint to load in '{}': it has no `latest` file. Save one with "
                   "save_state(), or pass the tag to load",
                   dir);
    }
    tag_ = *latest;
  } else {
    tag_ = tag;
  }
  path_ = dir + "/" + tag_;
  meta_ = read_checkpoint_meta(path_);
  const auto& files = meta_.at("files");
  const bool each_node = meta_.value("save_on_each_node", false);
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string name = files[i].at("name").get<std::string>();
    const std::string file_path = path_ + "/" + name;
    if (!detail::path_exists(file_path)) {
      if (each_node) {  // another host's
        files_.push_back(nullptr);
        absent_.push_back(name);
        continue;
      }
      TANDEM_THROW(CheckpointError, "'{}' is missing: checkpoint '{}' is incomplete", file_path,
                   path_);
    }
    auto reader = std::make_unique<SafetensorsReader>(file_path);
    const std::string crc = fmt::format("{:08x}", reader->header_crc32c());
    if (reader->file_size() != files[i].at("bytes").get<int64_t>() ||
        crc != files[i].at("header_crc32c").get<std::string>()) {
      TANDEM_THROW(CheckpointError,
                   "'{}' does not match meta.json (size {} bytes, header checksum {}; "
                   "expected {} bytes, {}): the file was truncated or replaced",
                   file_path, reader->file_size(), crc, files[i].at("bytes").get<int64_t>(),
                   files[i].at("header_crc32c").get<std::string>());
    }
    for (const auto& entry : reader->entries()) {
      const auto at = entry.name.rfind('@');
      if (at == std::string::npos) continue;
      Fragment fragment;
      fragment.file = i;
      fragment.key = entry.name;
      try {
        fragment.begin = std::stoll(entry.name.substr(at + 1));
      } catch (const std::exception&) {
        TANDEM_THROW(CheckpointError, "'{}': tensor '{}' has a malformed fragment offset",
                     file_path, entry.name);
      }
      fragment.length = entry.numel();
      fragments_[entry.name.substr(0, at)].push_back(fragment);
    }
    files_.push_back(std::move(reader));
  }
  for (auto& [name, list] : fragments_) {
    std::sort(list.begin(), list.end(),
              [](const Fragment& a, const Fragment& b) { return a.begin < b.begin; });
  }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

int CheckpointReader::world_size() const { return meta_.at("world_size").get<int>(); }

bool CheckpointReader::has(const std::string& section, const std::string& name) const {
  return fragments_.count(section + "/" + name) != 0;
}

at::Tensor CheckpointReader::read_range(const std::string& section, const std::string& name,
                                        int64_t begin, int64_t length) const {
  const std::string key = section + "/" + name;
  const auto it = fragments_.find(key);
  if (it == fragments_.end()) {
    TANDEM_THROW(CheckpointError, "checkpoint '{}' has no '{}'{}", path_, key,
                 absent_.empty() ? "" : ": " + missing_data_reason());
  }
  const auto& list = it->second;
  const auto& first = *files_[list.front().file]->find(list.front().key);
  at::Tensor out = at::empty({length}, at::TensorOptions().dtype(first.dtype));
  int64_t covered = begin;
  const int64_t end = begin + length;
  for (const auto& f : list) {
    if (covered >= end) break;
    const int64_t f_end = f.begin + f.length;
    if (f_end <= covered || f.length == 0) continue;
    if (f.begin > covered) break;  // a hole
    const int64_t take_end = std::min(f_end, end);
    at::Tensor data;
    if (f.begin == covered && f_end == take_end && f.begin >= begin) {
      data = out.narrow(0, covered - begin, take_end - covered);
      files_[f.file]->read_into(f.key, data);
    } else {
      data = files_[f.file]->read(f.key).view({-1});
      TANDEM_CHECK(data.scalar_type() == out.scalar_type(),
                   "checkpoint '{}': fragments of '{}' have different dtypes", path_, key);
      out.narrow(0, covered - begin, take_end - covered)
          .copy_(data.narrow(0, covered - f.begin, take_end - covered));
    }
    covered = take_end;
  }
  if (covered < end) {
    TANDEM_THROW(CheckpointError,
                 "checkpoint '{}': the fragments of '{}' do not cover elements [{}, {}) "
                 "(covered up to {}): {}",
                 path_, key, begin, end, covered, missing_data_reason());
  }
  return out;
}

void CheckpointReader::read_range_into(const std::string& section, const std::string& name,
                                       int64_t begin, const at::Tensor& dst) const {
  const auto it = fragments_.find(section + "/" + name);
  if (it != fragments_.end() && dst.is_cpu() && dst.is_contiguous()) {
    for (const auto& f : it->second) {
      if (f.begin != begin || f.length != dst.numel()) continue;
      if (files_[f.file]->find(f.key)->dtype != dst.scalar_type()) break;
      files_[f.file]->read_into(f.key, dst);
      return;
    }
  }
  dst.copy_(read_range(section, name, begin, dst.numel()).view(dst.sizes()));
}

at::Tensor CheckpointReader::read_whole(const std::string& section, const std::string& name,
                                        const std::vector<int64_t>& shape) const {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return read_range(section, name, 0, numel).view(shape);
}

std::optional<at::Tensor> CheckpointReader::read_rank_tensor(int rank,
                                                             const std::string& key) const {
  if (rank < 0 || rank >= static_cast<int>(files_.size()) || !files_[rank]) return std::nullopt;
  if (files_[rank]->find(key) == nullptr) return std::nullopt;
  return files_[rank]->read(key);
}

std::optional<at::Tensor> CheckpointReader::read_main_tensor(const std::string& key) const {
  if (!files_.empty() && files_[0]) return read_rank_tensor(0, key);
  for (const auto& file : files_) {
    if (file && file->find(key) != nullptr) return file->read(key);
  }
  return std::nullopt;
}

std::string CheckpointReader::missing_data_reason() const {
  if (absent_.empty()) return "a rank file is missing data";
  std::string names;
  for (std::size_t i = 0; i < absent_.size() && i < 8; ++i) {
    names += (i ? ", " : "") + absent_[i];
  }
  if (absent_.size() > 8) names += fmt::format(", ... ({} in all)", absent_.size());
  return fmt::format(
      "it was saved with save_on_each_node, and this host's copy lacks {} (they are on the "
      "other hosts). Load it on the hosts that saved it, at the same world size and layout, or "
      "first copy every host's '{}' into one folder",
      names, path_);
}

}  // namespace tandem
