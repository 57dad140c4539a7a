#include "checkpoint/checkpoint_meta.h"

#include <dirent.h>

#include <algorithm>
#include <fmt/format.h>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/crc32c.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/core/error.h"

namespace tandem {
namespace detail {
namespace {

std::string checksum_of(const nlohmann::json& meta) {
  const std::string text = meta.dump();
  return fmt::format("{:08x}", crc32c(text.data(), text.size()));
}

}  // namespace

std::string seal_meta(nlohmann::json meta) {
  meta.erase("checksum");
  meta["checksum"] = checksum_of(meta);
  return meta.dump(1) + "\n";
}

nlohmann::json open_meta(const std::string& text, const std::string& path) {
  nlohmann::json meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) {
    TANDEM_THROW(CheckpointError,
                 "'{}' is not valid JSON: the checkpoint metadata is corrupt. Load an earlier "
                 "tag (see `tandem checkpoint inspect`)",
                 path);
  }
  if (meta.value("format", "") != kCheckpointFormat) {
    TANDEM_THROW(CheckpointError, "'{}' is not tandem checkpoint metadata (format '{}')", path,
                 meta.value("format", std::string("missing")));
  }
  if (!meta.contains("checksum") || !meta["checksum"].is_string()) {
    TANDEM_THROW(CheckpointError, "'{}' has no checksum: the metadata is corrupt", path);
  }
  const std::string stored = meta["checksum"].get<std::string>();
  meta.erase("checksum");
  if (stored != checksum_of(meta)) {
    TANDEM_THROW(CheckpointError,
                 "'{}' fails its checksum: the metadata is corrupt (bit flip or partial "
                 "write). Load an earlier tag",
                 path);
  }
  const int version = meta.value("version", 0);
  if (version != kCheckpointVersion) {
    TANDEM_THROW(CheckpointError,
                 "'{}' has checkpoint format version {}; this tandem reads version {}", path,
                 version, kCheckpointVersion);
  }
  return meta;
}

std::string temporary_tag_dir(const std::string& dir, const std::string& tag) {
  return dir + "/.tmp-" + tag;
}

void check_tag(const std::string& tag) {
  TANDEM_CHECK_ARG(!tag.empty() && tag != "." && tag != ".." && tag[0] != '.' &&
                       tag.find('/') == std::string::npos && tag != "latest",
                   "checkpoint tag '{}' must be a plain name (no '/', not starting with '.', "
                   "not 'latest'), e.g. global_step1000",
                   tag);
}

}  // namespace detail

std::string checkpoint_rank_file(int rank) { return fmt::format("rank_{:05d}.safetensors", rank); }

std::string fragment_key(const std::string& section, const std::string& name, int64_t begin) {
  return fmt::format("{}/{}@{}", section, name, begin);
}

nlohmann::json read_checkpoint_meta(const std::string& tag_dir) {
  const std::string path = tag_dir + "/meta.json";
  if (!detail::path_exists(path)) {
    TANDEM_THROW(CheckpointError,
                 "'{}' is missing: '{}' is not a committed tandem checkpoint", path, tag_dir);
  }
  return detail::open_meta(detail::read_small_file(path), path);
}

std::optional<std::string> latest_checkpoint_tag(const std::string& dir) {
  const std::string path = dir + "/latest";
  if (!detail::path_exists(path)) return std::nullopt;
  std::string tag = detail::read_small_file(path);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) {
    tag.pop_back();
  }
  if (tag.empty() || tag.find('/') != std::string::npos || tag[0] == '.' ||
      !detail::path_exists(dir + "/" + tag + "/meta.json")) {
    TANDEM_THROW(CheckpointError,
                 "'{}' names '{}', which is not a committed checkpoint in '{}'. Pass a tag "
                 "explicitly (`tandem checkpoint inspect {}` lists them)",
                 path, tag, dir, dir);
  }
  return tag;
}

std::vector<std::string> checkpoint_tags(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return {};
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.') continue;
    const std::string meta_path = dir + "/" + name + "/meta.json";
    if (!detail::path_exists(meta_path)) continue;
    int64_t step = -1;
    try {
      step = read_checkpoint_meta(dir + "/" + name).value("step", int64_t{-1});
    } catch (const CheckpointError&) {
      // A corrupt tag still counts (and sorts first) so that pruning and
      // inspect can see it.
    }
    found.emplace_back(step, name);
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  std::vector<std::string> tags;
  for (auto& [step, name] : found) tags.push_back(name);
  return tags;
}

}  // namespace tandem
