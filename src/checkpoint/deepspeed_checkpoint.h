#pragma once
// A DeepSpeed ZeRO checkpoint folder (what engine.save_checkpoint writes at
// stages 1, 2 and 3, any data-parallel world size) read back into whole
// tensors: each parameter's value, fp32 master and optimizer state,
// reassembled from the ranks' flat partitions as DeepSpeed's own
// zero_to_fp32.py reassembles them, plus the step counts, hyperparameters,
// scheduler, loss scaler and client state as JSON. Every file is read with
// the weights-only reader (torch_save_reader.h): nothing in it is executed.
//
// Stage 1/2: each optimizer param group is one flat fp32 vector cut into
// world-size partitions (single_partition_of_fp32_groups, the last one
// without its padding); parameters lie in it in param_shapes order, with
// param_alignment_paddings between them. Stage 3: every parameter is cut
// into world-size pieces of ceil(numel / world) elements, and rank r's
// fp32_flat_groups hold its piece of each parameter in param_shapes order.
// The optimizer's state tensors (exp_avg, ...) have the same layout as the
// fp32 partitions.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace tandem::detail {

struct DeepSpeedParameter {
  std::string name;
  std::vector<int64_t> shape;
  int group = -1;  // its optimizer param group; -1 for a frozen parameter
  at::Tensor value;   // whole, in the module's dtype
  at::Tensor master;  // whole fp32 master (trainable parameters)
  std::vector<std::pair<std::string, at::Tensor>> state;  // "exp_avg", ... whole
};

struct DeepSpeedCheckpoint {
  std::string tag;
  int zero_stage = 0;
  int world_size = 0;  // data-parallel ranks that saved it
  int64_t global_steps = 0;
  int64_t skipped_steps = 0;
  int64_t global_samples = 0;
  int64_t optimizer_step = 0;  // the base optimizer's own count (Adam's "step")
  // Trainable ones in DeepSpeed's order, then the frozen ones. Tied
  // parameters appear once, under the name DeepSpeed keeps.
  std::vector<DeepSpeedParameter> parameters;
  std::map<std::string, std::string> shared;  // tied name -> the name it shares
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  std::string module_dtype;                   // "F32", "BF16", "F16"
  nlohmann::ordered_json param_groups;        // the base optimizer's, without "params"
  nlohmann::ordered_json lr_scheduler;        // its state_dict(); null when none
  nlohmann::ordered_json loss_scaler;         // the optimizer's scaler record
  nlohmann::ordered_json client_state;        // save_checkpoint(client_state=...)
  nlohmann::ordered_json ds_config;
  std::string ds_version;
  // What the folder holds that has no place in a tandem checkpoint
  // ("data_sampler", ...), for the importer to report.
  std::vector<std::string> not_carried;
};

// Reads `dir`/`tag` (`tag` empty: the one `dir`/latest names).
// CheckpointError naming the file and what is wrong for a missing or
// malformed folder, and for what tandem cannot reassemble: tensor or
// pipeline parallelism (mp_rank_01, layer_* files), a checkpoint without
// ZeRO optimizer states, a missing rank.
DeepSpeedCheckpoint read_deepspeed_checkpoint(const std::string& dir, const std::string& tag);

// Whether `dir` looks like a DeepSpeed checkpoint folder: a `latest` file
// or a subfolder holding *_model_states.pt.
bool is_deepspeed_checkpoint(const std::string& dir);

}  // namespace tandem::detail
