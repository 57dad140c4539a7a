#pragma once
// Sharded, atomic checkpoints: the directory layout, the collective commit,
// and a reader that reassembles any tensor from the fragments the ranks
// wrote, whatever the world size of the run that reads it.
//
//   DIR/latest                  the committed tag to resume from ("global_step40\n")
//   DIR/<tag>/meta.json         what was saved: world size, strategy, shapes,
//                               optimizer, scheduler, scaler, data position,
//                               client state; self-checksummed
//   DIR/<tag>/rank_00000.safetensors   each rank's tensors (and RNG states)
//   DIR/.tmp-<tag>/             a save in progress; never read, removed by
//                               the next save
//
// Tensor names in the rank files:
//   <section>/<name>@<begin>   a fragment: elements [begin, begin + n) of the
//                              flattened tensor <name>, stored 1-D. Sections:
//                              model (parameters), master (fp32 masters),
//                              optim/<state> (exp_avg, exp_avg_sq, ...).
//   buffer/<name>              a whole module buffer (rank 0 only)
//   rng/cpu, rng/cuda<i>       the rank's generator states
// ZeRO ranks each write the fragments of their own shard; a DDP run writes
// whole tensors (one fragment at 0) from rank 0. Readers only ever ask for
// "elements [b, e) of <section>/<name>", so any layout loads into any other.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace tandem {

class ProcessGroup;
class SafetensorsReader;

inline constexpr const char* kCheckpointFormat = "tandem-checkpoint";
inline constexpr int kCheckpointVersion = 1;

// "rank_00003.safetensors".
std::string checkpoint_rank_file(int rank);
// "<section>/<name>@<begin>".
std::string fragment_key(const std::string& section, const std::string& name, int64_t begin);

// The tag `latest` names in `dir`; nullopt when there is no `latest` file.
// CheckpointError when it cannot be read or names no committed tag.
std::optional<std::string> latest_checkpoint_tag(const std::string& dir);
// Committed tags in `dir` (directories holding a meta.json), oldest step
// first.
std::vector<std::string> checkpoint_tags(const std::string& dir);

struct CheckpointCommitOptions {
  // Keep only the newest `total_limit` tags (by step); 0 keeps all. Never
  // deletes the tag being written or the one `latest` names.
  int total_limit = 0;
  // Point `latest` at the new tag.
  bool update_latest = true;
  // Accelerate's save_on_each_node, for hosts without a shared file system:
  // `dir` is each host's own folder. Every host's local main (its lowest
  // rank) prepares and commits the tag there, with rank 0's meta.json
  // listing every rank's file, and the ranks of the host write their files
  // into it. Hosts that see the same folder (found by marker files at each
  // save) commit it once, by their lowest rank. meta.json says
  // "save_on_each_node": true, so that a reader accepts the other hosts'
  // files being absent.
  bool save_on_each_node = false;
};

// This rank's tensors for its checkpoint file, in file order.
using CheckpointTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes what `collect` returns as this rank's file of checkpoint `dir`/`tag`
// and, once
// every rank has written and fsynced its file, commits: rank 0 adds
// `meta` (with the file table and a checksum), renames the temporary
// directory into place (swapping atomically with an existing tag of that
// name), replaces `latest` by rename and fsyncs `dir`. If any rank fails,
// nothing is committed, the temporary files are removed, and every rank
// throws CheckpointError naming the failed ranks and their reasons (an
// exception from `collect` counts as this rank failing; it must not issue
// collectives). Collective: every rank of `pg` calls it with the same dir
// and tag. Only rank 0's `meta` is used.
void commit_checkpoint(ProcessGroup& pg, const std::string& dir, const std::string& tag,
                       const std::function<CheckpointTensors()>& collect, nlohmann::json meta,
                       const CheckpointCommitOptions& options = {});

// Reads one committed checkpoint. Opening reads and verifies meta.json and
// every rank file's header (not the data). Thread-safety: const methods may
// run concurrently.
class CheckpointReader {
 public:
  // `tag` empty: the one `latest` names. CheckpointError when there is no
  // checkpoint, or when meta.json or a header is missing, corrupt or from an
  // unknown format version.
  CheckpointReader(const std::string& dir, const std::string& tag = "");
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& tag() const { return tag_; }
  const std::string& path() const { return path_; }  // DIR/<tag>
  const nlohmann::json& meta() const { return meta_; }
  int world_size() const;

  // Whether any rank saved fragments of <section>/<name>.
  bool has(const std::string& section, const std::string& name) const;
  // Elements [begin, begin + length) of the flattened tensor, as a 1-D CPU
  // tensor of the saved dtype, assembled from the fragments that cover it.
  // CheckpointError when they do not cover the range.
  at::Tensor read_range(const std::string& section, const std::string& name, int64_t begin,
                        int64_t length) const;
  // Elements [begin, begin + dst.numel()) into `dst` (any dtype, device
  // and layout; cast when the saved dtype differs). Reads straight into a
  // contiguous CPU `dst` of the saved dtype when one fragment matches, which
  // is the common case (same layout as the saving run).
  void read_range_into(const std::string& section, const std::string& name, int64_t begin,
                       const at::Tensor& dst) const;
  // The whole tensor with `shape`.
  at::Tensor read_whole(const std::string& section, const std::string& name,
                        const std::vector<int64_t>& shape) const;
  // A tensor stored whole under `key` in `rank`'s file (buffers, RNG
  // states); nullopt when that file has no such key.
  std::optional<at::Tensor> read_rank_tensor(int rank, const std::string& key) const;
  // A tensor rank 0 stores whole (buffers, custom objects): from rank 0's
  // file, or, on a host of a save_on_each_node checkpoint without it, from
  // the file of the rank that wrote its copy there (the host's local main).
  std::optional<at::Tensor> read_main_tensor(const std::string& key) const;
  // Rank files meta.json lists that are not in this folder (only a
  // save_on_each_node checkpoint may lack some: they are on other hosts).
  const std::vector<std::string>& absent_files() const { return absent_; }

 private:
  // Why a tensor's fragments are not all here, for an error message.
  std::string missing_data_reason() const;

  struct Fragment {
    std::size_t file = 0;
    std::string key;
    int64_t begin = 0;
    int64_t length = 0;
  };
  std::string tag_;
  std::string path_;
  nlohmann::json meta_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;  // null: absent
  std::vector<std::string> absent_;
  std::map<std::string, std::vector<Fragment>> fragments_;  // "<section>/<name>" -> fragments
};

// The parsed, checksum-verified meta.json of DIR/<tag>.
nlohmann::json read_checkpoint_meta(const std::string& tag_dir);

}  // namespace tandem
