#pragma once
// A torch::optim optimizer's state as plain data, for checkpoints: its
// param-group hyperparameters as JSON and each parameter's state tensors by
// name (the names ZeRO uses too: exp_avg, exp_avg_sq, momentum_buffer, ...),
// so a DDP checkpoint loads under ZeRO and back. LibTorch's own
// serialisation is TorchScript pickle, which tandem checkpoints never use.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

namespace tandem::detail {

// "Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Lion" or "Lamb"; UsageError for others
// (LBFGS, custom optimizers), naming what is supported.
std::string optimizer_type(torch::optim::Optimizer& optimizer);

// Each param group's options (lr, betas, ...) as a JSON array.
nlohmann::json param_group_options(torch::optim::Optimizer& optimizer);
// Writes options saved by param_group_options() back; UsageError when the
// group count or the optimizer type differs.
void load_param_group_options(torch::optim::Optimizer& optimizer, const nlohmann::json& groups);

struct ParamState {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // defined tensors only
  int64_t step = -1;  // -1: the optimizer keeps no step count (SGD)
};
// The state `optimizer` keeps for `param`; empty tensors when it has none
// yet (no step taken).
ParamState get_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);
// Creates or replaces `param`'s state from tensors named as above. They
// are adopted as they are when their dtype and device match `param`'s
// (converted otherwise), so pass tensors nothing else uses.
void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                     const ParamState& state);

}  // namespace tandem::detail
