// Checkpointer::save_model and load_model_weights (checkpointer.h): one
// prepared model's weights on their own, as one safetensors file written
// from the shards (partitioned parameters streamed one unit at a time), and
// pretrained weights read into the model through its strategy.

#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>

#include <ATen/ATen.h>

#include "accelerate/checkpointer.h"
#include "accelerate/model_strategy.h"
#include "checkpoint/checkpoint_fs.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem::detail {

void Checkpointer::save_model(std::size_t index, const std::string& dir) {
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

  const std::string final_path = dir + "/model.safetensors";
  const std::string tmp_path = dir + "/.model.safetensors.tmp";
  std::string error;
  std::unique_ptr<SafetensorsStreamWriter> writer;
  auto guarded = [&](const std::function<void()>& fn) {
    if (!rank0 || !error.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
      writer.reset();  // unlinks the partial file
    }
  };
  guarded([&] {
    make_directories(dir);
    // {"format": "pt"}, as Accelerate's save_model (safetensors' save_file
    // with metadata={"format": "pt"}) writes it: transformers' loaders
    // refuse a file whose metadata lacks it.
    writer = std::make_unique<SafetensorsStreamWriter>(
        tmp_path, specs, std::map<std::string, std::string>{{"format", "pt"}});
  });
  // Collective even after a rank-0 failure, so no rank is left waiting.
  if (partitioned != nullptr) {
    partitioned->for_each_partitioned_whole([&](const std::string& name, const at::Tensor& p) {
      guarded([&] { writer->write(name, saved_value(p)); });
    });
  }
  guarded([&] {
    for (const auto& [name, t] : rest) writer->write(name, t);
    writer->finish(/*sync=*/true);
    writer.reset();
    rename_path(tmp_path, final_path);
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
