// The collective commit of a checkpoint (see tandem/checkpoint/checkpoint.h).
// Three rounds, each ended by an all-gather of every rank's error text so
// that all ranks take the same branch: prepare the temporary directory (rank
// 0), write the rank files (all), commit (rank 0). With save_on_each_node
// each folder's committer (a host's local main) prepares and commits its
// folder, with rank 0's meta.json. A process killed at any
// point leaves the committed tags and `latest` as they were: until the
// final renames nothing outside DIR/.tmp-<tag> changes, and each rename is
// atomic.

#include <dirent.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/checkpoint_fs.h"
#include "checkpoint/checkpoint_meta.h"
#include "comm/agreement.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

// Every rank's error text (empty: success), identical on all ranks.
std::vector<std::string> agree(ProcessGroup& pg, const std::string& error) {
  return pg.all_gather_strings(error);
}

void remove_stale_temporaries(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.rfind(".tmp-", 0) == 0 || name == ".latest.tmp") stale.push_back(dir + "/" + name);
  }
  ::closedir(d);
  for (const auto& path : stale) detail::remove_tree_quietly(path);
}

// Moves DIR/.tmp-<tag> to DIR/<tag>, replacing an existing tag atomically.
void install(const std::string& dir, const std::string& tmp, const std::string& final_dir) {
  if (!detail::path_exists(final_dir)) {
    detail::rename_path(tmp, final_dir);
  } else if (detail::exchange_paths(tmp, final_dir)) {
    detail::remove_tree_quietly(tmp);  // now the old contents
  } else {
    // No RENAME_EXCHANGE on this file system: a short window without the tag.
    const std::string old = final_dir.substr(0, final_dir.rfind('/')) + "/.tmp-old-" +
                            final_dir.substr(final_dir.rfind('/') + 1);
    detail::rename_path(final_dir, old);
    detail::rename_path(tmp, final_dir);
    detail::remove_tree_quietly(old);
  }
  detail::fsync_directory(dir);
}

// `latest` is written in two halves: the new text into DIR/.latest.tmp
// before the tag is installed (the last write that needs space, so a full
// disk fails the save before anything is committed), and the rename that
// publishes it after.
std::string stage_latest(const std::string& dir, const std::string& tag) {
  const std::string tmp = dir + "/.latest.tmp";
  detail::write_file_synced(tmp, tag + "\n");
  return tmp;
}

void publish_latest(const std::string& dir, const std::string& staged) {
  detail::rename_path(staged, dir + "/latest");
  detail::fsync_directory(dir);
}

void prune(const std::string& dir, const std::string& keep_tag, int total_limit) {
  if (total_limit <= 0) return;
  const std::vector<std::string> tags = checkpoint_tags(dir);  // oldest first
  const std::optional<std::string> latest = latest_checkpoint_tag(dir);
  auto excess = static_cast<int64_t>(tags.size()) - total_limit;
  for (const auto& tag : tags) {
    if (excess <= 0) break;
    if (tag == keep_tag || (latest && tag == *latest)) continue;
    // Hide it with one atomic rename first, so no reader sees half a tag.
    const std::string doomed = detail::temporary_tag_dir(dir, "deleting-" + tag);
    detail::rename_path(dir + "/" + tag, doomed);
    detail::remove_tree_quietly(doomed);
    --excess;
  }
  detail::fsync_directory(dir);
}

// save_on_each_node: every host's local main (its lowest rank) clears the
// old temporaries of its folder and, after everyone did, creates DIR/.tmp-<tag>
// and leaves a marker named after its rank in it. The markers a local main
// sees are those of the hosts sharing its folder: the lowest of them commits
// the folder. Returns whether this rank commits one; CheckpointError on
// every rank when a folder cannot be prepared.
bool find_folder_committers(ProcessGroup& pg, const std::string& dir, const std::string& tmp) {
  const int rank = pg.rank();
  const std::vector<std::string> hosts = pg.host_ids();
  bool local_main = true;
  for (int r = 0; r < rank; ++r) local_main = local_main && hosts[r] != hosts[rank];
  const std::string marker = ".host-of-rank-";
  auto run_step = [&](const char* what, const std::function<void()>& step) {
    std::string error;
    if (local_main) {
      try {
        step();
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    const std::vector<std::string> errors = pg.all_gather_strings(error);
    const std::string failed = detail::rank_failures(errors);
    if (!failed.empty()) {
      if (local_main) detail::remove_tree_quietly(tmp);
      TANDEM_THROW(CheckpointError, "save_state('{}') could not {} (save_on_each_node):{}", dir,
                   what, failed);
    }
  };
  run_step("clear its old temporaries", [&] {
    detail::make_directories(dir);
    remove_stale_temporaries(dir);
  });
  run_step("prepare its folder", [&] {
    detail::make_directories(tmp);
    detail::write_file_synced(tmp + "/" + marker + std::to_string(rank), hosts[rank] + "\n");
  });
  bool committer = false;
  run_step("find the hosts sharing its folder", [&] {
    int lowest = rank;
    DIR* d = ::opendir(tmp.c_str());
    TANDEM_CHECK(d != nullptr, "cannot list '{}'", tmp);
    while (dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name.rfind(marker, 0) == 0) lowest = std::min(lowest, std::stoi(name.substr(marker.size())));
    }
    ::closedir(d);
    committer = lowest == rank;
  });
  // Every marker read before any is removed: the committers remove them.
  run_step("clear its markers", [&] {
    if (!committer) return;
    DIR* d = ::opendir(tmp.c_str());
    TANDEM_CHECK(d != nullptr, "cannot list '{}'", tmp);
    std::vector<std::string> markers;
    while (dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name.rfind(marker, 0) == 0) markers.push_back(tmp + "/" + name);
    }
    ::closedir(d);
    for (const auto& path : markers) detail::remove_tree_quietly(path);
  });
  return committer;
}

}  // namespace

void commit_checkpoint(ProcessGroup& pg, const std::string& dir, const std::string& tag,
                       const std::function<CheckpointTensors()>& collect, nlohmann::json meta,
                       const CheckpointCommitOptions& options) {
  detail::check_tag(tag);
  TANDEM_CHECK_ARG(!dir.empty(), "save_state: the checkpoint directory is empty");
  const int rank = pg.rank();
  const std::vector<std::string> targets = pg.all_gather_strings(dir + "/" + tag);
  for (std::size_t r = 1; r < targets.size(); ++r) {
    TANDEM_CHECK_ARG(targets[r] == targets[0],
                     "save_state: rank {} saves to '{}' but rank 0 to '{}'. Every rank must "
                     "pass the same directory and tag",
                     r, targets[r], targets[0]);
  }
  const std::string tmp = detail::temporary_tag_dir(dir, tag);
  const std::string final_dir = dir + "/" + tag;

  // Who prepares and commits the folder: rank 0, or with save_on_each_node
  // the lowest rank of each group of hosts that see the same folder.
  const bool committer = options.save_on_each_node ? find_folder_committers(pg, dir, tmp)
                                                   : rank == 0;
  std::string error;
  if (rank == 0 && !options.save_on_each_node) {
    try {
      detail::make_directories(dir);
      remove_stale_temporaries(dir);
      detail::make_directories(tmp);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::vector<std::string> errors = agree(pg, error);
  if (!errors[0].empty()) {
    TANDEM_THROW(CheckpointError, "save_state('{}', tag '{}') could not start:{}", dir, tag,
                 detail::rank_failures(errors));
  }

  const std::string file = tmp + "/" + checkpoint_rank_file(rank);
  SafetensorsWriteResult written;
  try {
    written = write_safetensors(file, collect(), {}, /*sync=*/true);
  } catch (const std::exception& e) {
    error = e.what();
  }
  errors = agree(pg, error.empty() ? "" : error);
  const std::string failed = detail::rank_failures(errors);
  std::vector<std::string> reports;
  if (failed.empty()) {
    reports = pg.all_gather_strings(
        nlohmann::json{{"bytes", written.bytes},
                       {"header_crc32c", fmt::format("{:08x}", written.header_crc32c)}}
            .dump());
  }
  if (!failed.empty()) {
    detail::remove_tree_quietly(file);
    pg.barrier();
    if (committer) detail::remove_tree_quietly(tmp);
    TANDEM_THROW(CheckpointError,
                 "save_state('{}', tag '{}') failed; nothing was committed and '{}' still "
                 "holds the previous checkpoints:{}",
                 dir, tag, dir, failed);
  }

  // Rank 0's meta.json, for every other folder's committer too.
  std::string sealed;
  if (rank == 0) {
    try {
      nlohmann::json files = nlohmann::json::array();
      for (std::size_t r = 0; r < reports.size(); ++r) {
        nlohmann::json entry = nlohmann::json::parse(reports[r]);
        entry["name"] = checkpoint_rank_file(static_cast<int>(r));
        entry["rank"] = r;
        files.push_back(entry);
      }
      meta["format"] = kCheckpointFormat;
      meta["version"] = kCheckpointVersion;
      meta["tag"] = tag;
      meta["world_size"] = pg.world_size();
      meta["files"] = files;
      if (options.save_on_each_node) meta["save_on_each_node"] = true;
      sealed = detail::seal_meta(meta);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (options.save_on_each_node) {
    sealed = pg.all_gather_strings(committer ? sealed : "")[0];
  }
  if (committer && error.empty()) {
    const bool tag_existed = detail::path_exists(final_dir);
    bool installed = false;
    try {
      TANDEM_CHECK(!sealed.empty(), "rank 0 built no meta.json");
      detail::write_file_synced(tmp + "/meta.json", sealed);
      detail::fsync_directory(tmp);
      const std::string staged = options.update_latest ? stage_latest(dir, tag) : "";
      install(dir, tmp, final_dir);
      installed = true;
      if (!staged.empty()) publish_latest(dir, staged);
    } catch (const std::exception& e) {
      error = e.what();
      detail::remove_tree_quietly(dir + "/.latest.tmp");
      // A new tag that `latest` could not name is taken back, so that the
      // save commits nothing (a tag it replaced is already gone).
      if (installed && !tag_existed) {
        detail::remove_tree_quietly(final_dir);
        installed = detail::path_exists(final_dir);
      }
      if (!installed) error += "; nothing was committed";
    }
    if (error.empty()) {
      try {
        prune(dir, tag, options.total_limit);
      } catch (const std::exception& e) {
        // The checkpoint is committed; only older ones may be left over.
        log_warn("save_state('{}', tag '{}'): saved, but removing checkpoints beyond "
                 "total_limit {} failed: {}",
                 dir, tag, options.total_limit, e.what());
      }
    }
  }
  if (committer && !error.empty() && detail::path_exists(tmp)) detail::remove_tree_quietly(tmp);
  errors = agree(pg, error);
  const std::string commit_failures = detail::rank_failures(errors);
  if (!commit_failures.empty()) {
    TANDEM_THROW(CheckpointError, "save_state('{}', tag '{}') failed to commit:{}", dir, tag,
                 commit_failures);
  }
}

}  // namespace tandem
