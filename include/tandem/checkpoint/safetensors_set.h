#pragma once
// Weights that may span several safetensors files, as Hugging Face stores
// large models:
//
//   DIR/model.safetensors.index.json   {"metadata": {"total_size": N},
//                                       "weight_map": {"<tensor>": "<file>", ...}}
//   DIR/model-00001-of-00003.safetensors
//   DIR/model-00002-of-00003.safetensors ...
//
// SafetensorsSet reads such a set, or a single file, as one collection of
// named tensors; the writing side (shard names, the split by size, the
// index) is here too, for `tandem checkpoint merge --max-shard-size`.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/checkpoint/safetensors.h"

namespace tandem {

inline constexpr const char* kSafetensorsWeightsName = "model.safetensors";
inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

// A set of safetensors files opened for reading. `path` is one of
//   - a safetensors file;
//   - an index (a file ending in ".json", Hugging Face's format above);
//   - a directory: its model.safetensors if present (as transformers'
//     from_pretrained prefers it), else its model.safetensors.index.json,
//     else its only *.safetensors.index.json or only *.safetensors file.
// Opening validates the index and every file's header, not the data:
// CheckpointError naming the file and what to do for a missing path or
// shard, an index that is not JSON or lacks "weight_map", a shard name that
// leaves the index's directory ("../x", "/abs"), and a tensor the index maps
// to a file that does not hold it. Tensors a shard holds but the index does
// not name are not part of the set (the index is what the set is).
// Thread-safety: const methods may run concurrently. Movable.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& path);
  ~SafetensorsSet();
  SafetensorsSet(SafetensorsSet&&) noexcept;
  SafetensorsSet& operator=(SafetensorsSet&&) noexcept;

  // The file or index that was opened (after resolving a directory).
  const std::string& path() const { return path_; }
  // True when read through an index.
  bool indexed() const { return indexed_; }
  // The safetensors files, in name order.
  std::vector<std::string> files() const;
  // Every tensor of the set: files in name order, each in data order.
  const std::vector<const SafetensorsEntry*>& entries() const { return entries_; }
  // The entry named `name`, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  // The file holding `name` (CheckpointError if the set has no such tensor).
  const SafetensorsReader& reader_of(const std::string& name) const;

  // SafetensorsReader::read and read_range_into on the file holding `name`
  // (same conversions, errors and checksum rules).
  at::Tensor read(const std::string& name) const;
  void read_range_into(const std::string& name, int64_t begin, const at::Tensor& dst) const;

  // Tensor bytes read so far from all the files. Thread-safe.
  int64_t bytes_read() const;

 private:
  void open_index(const std::string& index_path);
  void open_file(const std::string& file_path);
  void index_entries();

  std::string path_;
  bool indexed_ = false;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;  // in file name order
  std::map<std::string, std::size_t> reader_of_;             // tensor -> readers_ index
  std::vector<const SafetensorsEntry*> entries_;
};

// A size as Hugging Face's max_shard_size spells it: "2GB" (10^9 bytes),
// "500MB", "10KB", "1GiB" (2^30), "64MiB", "1KiB", or plain bytes ("1000",
// "1000B"); case-insensitive, no space needed. UsageError for anything
// else (empty, negative, zero, fractions of a byte, unknown units).
int64_t parse_byte_size(const std::string& text);

// "model-00002-of-00005.safetensors" (1-based `index`).
std::string safetensors_shard_file_name(int index, int count);

// Splits tensors of `bytes[i]` data bytes, in order, into consecutive shards
// whose data stays within `max_shard_bytes`, as Hugging Face's
// split_torch_state_dict_into_shards does: a tensor that would overflow the
// current shard starts a new one, and a tensor larger than the limit on its
// own gets a shard of its own. Returns the tensor indices of each shard.
std::vector<std::vector<std::size_t>> plan_safetensors_shards(const std::vector<int64_t>& bytes,
                                                              int64_t max_shard_bytes);

// A Hugging Face set planned from its tensors' specs, in spec order:
// plan_safetensors_shards' shards (spec indices) by each tensor's data
// bytes, each shard's file name (kSafetensorsWeightsName when there is one
// shard, else safetensors_shard_file_name), and what the index holds. With
// no specs: one empty shard, model.safetensors.
struct SafetensorsSetPlan {
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::string> files;                 // per shard
  std::map<std::string, std::string> weight_map;  // tensor -> file
  int64_t total_size = 0;                         // data bytes of every tensor
};
SafetensorsSetPlan plan_safetensors_set(const std::vector<SafetensorsSpec>& specs,
                                        int64_t max_shard_bytes);

// The index text for `weight_map` (tensor -> file) and `total_size` (data
// bytes of all tensors): keys sorted, two-space indent, as transformers
// writes it.
std::string safetensors_index_json(const std::map<std::string, std::string>& weight_map,
                                   int64_t total_size);

}  // namespace tandem
