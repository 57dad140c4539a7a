// Checkpointer::save_model and load_model_weights (checkpointer.h): one
// prepared model's weights on their own, as one safetensors file written
// from the shards (partitioned parameters streamed one unit at a time), and
// pretrained weights read into the model through its strategy.

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include <ATen/ATen.h>

#include "accelerate/checkpointer.h"
#include "accelerate/model_strategy.h"
#include "checkpoint/checkpoint_fs.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/parameters.h"

namespace tandem::detail {

void Checkpointer::save_model(std::size_t index, const std::string& dir,
                              const std::string& max_shard_size) {
  torch::nn::Module& model = *prepared_.models().at(index).module;
  ModelStrategy& strategy = *prepared_.models()[index].strategy;
  const bool rank0 = main_process();
  // stage3_gather_16bit_weights_on_model_save (zero3_save_16bit_model):
  // every rank has the same config, so every rank refuses alike.
  const std::optional<bool> gather16 = config_.zero.gather_16bit_weights_on_model_save;
  PartitionedParameters* partitioned = strategy.partitioned();
  const bool gathers = partitioned != nullptr && partitioned->gathers_parameters_to_save();
  TANDEM_CHECK_ARG(!gathers || gather16.value_or(true),
                   "save_model('{}'): the model is sharded by ZeRO-3 and the config sets "
                   "stage3_gather_16bit_weights_on_model_save (Accelerate: "
                   "zero3_save_16bit_model) to false, so, as in Accelerate, there are no "
                   "consolidated weights to save. Set it to true to write the gathered weights "
                   "in the 16-bit training dtype, or save a sharded checkpoint with save_state() "
                   "and consolidate it with `tandem checkpoint merge`",
                   dir);
  // True: parameters are written in the training dtype (bf16/fp16 under
  // mixed precision), as DeepSpeed's _zero3_consolidated_16bit_state_dict.
  std::optional<at::ScalarType> param_dtype;
  if (gathers && gather16.value_or(false)) {
    if (config_.mixed_precision == MixedPrecision::kBf16) param_dtype = at::kBFloat16;
    if (config_.mixed_precision == MixedPrecision::kFp16) param_dtype = at::kHalf;
  }
  auto saved_dtype = [&](const at::Tensor& p) {
    return param_dtype && at::isFloatingType(p.scalar_type()) ? *param_dtype : p.scalar_type();
  };
  auto saved_value = [&](const at::Tensor& p) {
    return saved_dtype(p) == p.scalar_type() ? p : p.to(saved_dtype(p));
  };
  std::vector<SafetensorsSpec> specs;
  std::unordered_map<std::string, bool> sharded;
  std::vector<std::pair<std::string, at::Tensor>> rest;
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (auto& item : unique_named_parameters(model)) params.emplace_back(item.name, item.tensor);
  std::unordered_map<std::string, at::Tensor> by_name(params.begin(), params.end());
  // Partitioned parameters first, in the order the strategy gathers them.
  const std::vector<std::string> partitioned_names =
      partitioned != nullptr ? partitioned->partitioned_names() : std::vector<std::string>();
  for (const auto& name : partitioned_names) {
    const at::Tensor& p = by_name.at(name);
    specs.push_back({name, saved_dtype(p), p.sizes().vec()});
    sharded[name] = true;
  }
  for (const auto& [name, p] : params) {
    if (!sharded.count(name)) rest.emplace_back(name, saved_value(p));
  }
  for (auto& item : unique_named_buffers(model)) rest.push_back(item);
  for (const auto& [name, t] : rest) specs.push_back({name, t.scalar_type(), t.sizes().vec()});

  // Accelerate's save_model(max_shard_size=...): consecutive shards of at
  // most `max_bytes` each, as Hugging Face splits them, with an index; one
  // file when everything fits. Every rank parses and plans alike.
  const SafetensorsSetPlan plan = plan_safetensors_set(specs, parse_byte_size(max_shard_size));
  const std::vector<std::vector<std::size_t>>& shards = plan.shards;
  const std::vector<std::string>& names = plan.files;
  auto tmp_of = [&dir](const std::string& name) { return dir + "/.tmp-" + name; };
  // A tensor larger than the limit gets a shard of its own ahead of the one
  // being filled, so shards are not runs of the write order: every shard's
  // file is open at once, each written in its own order.
  std::unordered_map<std::string, std::size_t> shard_of;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    for (std::size_t i : shards[s]) shard_of[specs[i].name] = s;
  }
  std::string error;
  std::vector<std::unique_ptr<SafetensorsStreamWriter>> writers(shards.size());
  std::vector<std::size_t> written(shards.size(), 0);
  auto guarded = [&](const std::function<void()>& fn) {
    if (!rank0 || !error.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
      writers.clear();  // unlinks the partial files
      for (const auto& name : names) remove_tree_quietly(tmp_of(name));
    }
  };
  auto write = [&](const std::string& name, const at::Tensor& t) {
    const std::size_t s = shard_of.at(name);
    writers[s]->write(name, t);
    if (++written[s] == shards[s].size()) {
      writers[s]->finish(/*sync=*/true);
      writers[s].reset();
    }
  };
  guarded([&] {
    make_directories(dir);
    // {"format": "pt"}, as Accelerate's save_model (safetensors' save_file
    // with metadata={"format": "pt"}) writes it: transformers' loaders
    // refuse a file whose metadata lacks it.
    for (std::size_t s = 0; s < shards.size(); ++s) {
      std::vector<SafetensorsSpec> mine;
      for (std::size_t i : shards[s]) mine.push_back(specs[i]);
      writers[s] = std::make_unique<SafetensorsStreamWriter>(
          tmp_of(names[s]), std::move(mine),
          std::map<std::string, std::string>{{"format", "pt"}});
    }
  });
  // Collective even after a rank-0 failure, so no rank is left waiting.
  if (partitioned != nullptr) {
    partitioned->for_each_partitioned_whole([&](const std::string& name, const at::Tensor& p) {
      guarded([&] { write(name, saved_value(p)); });
    });
  }
  guarded([&] {
    for (const auto& [name, t] : rest) write(name, t);
    if (specs.empty()) {  // a model without parameters or buffers: an empty file
      writers[0]->finish(/*sync=*/true);
      writers[0].reset();
    }
    for (const auto& name : names) rename_path(tmp_of(name), dir + "/" + name);
    std::vector<std::string> keep = names;
    if (names.size() > 1) {
      const std::string index_tmp = tmp_of(kSafetensorsIndexName);
      write_file_synced(index_tmp, safetensors_index_json(plan.weight_map, plan.total_size));
      rename_path(index_tmp, dir + "/" + kSafetensorsIndexName);
      keep.emplace_back(kSafetensorsIndexName);
    }
    // Then what an earlier save_model left that a loader would read instead
    // (model.safetensors before an index; an index names its shards), once
    // the new weights are in place, so a crash in between loses nothing.
    std::error_code ignored;
    for (const std::string& old : fs::list_directory(dir, ignored)) {
      const bool weights = old == kSafetensorsWeightsName || old == kSafetensorsIndexName;
      const bool old_shard = old.size() == std::strlen("model-00001-of-00001.safetensors") &&
                             old.rfind("model-", 0) == 0 && old.find("-of-") == 11 &&
                             old.substr(old.size() - 12) == ".safetensors";
      if ((weights || old_shard) && std::find(keep.begin(), keep.end(), old) == keep.end()) {
        remove_tree_quietly(dir + "/" + old);
      }
    }
    fsync_directory(dir);
  });
  const std::vector<std::string> errors = group_->all_gather_strings(error);
  if (!errors[0].empty()) {
    TANDEM_THROW(CheckpointError, "save_model('{}') failed on rank 0: {}", dir, errors[0]);
  }
}

LoadSafetensorsResult Checkpointer::load_model_weights(std::size_t index, const std::string& path,
                                                      const LoadSafetensorsOptions& options) {
  return prepared_.models().at(index).strategy->load_weights(path, options,
                                                             prepared_.master_weights());
}

}  // namespace tandem::detail
