#pragma once
// How save_state names what it writes, shared by the Accelerator's
// checkpoint code and the model and optimizer strategies that contribute to
// it (docs/checkpoints.md has the layout). Private to the Accelerator.

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::detail {

// Sections: parameter values, fp32 master copies, and optimizer state.
inline constexpr const char* kModelSection = "model";
inline constexpr const char* kMasterSection = "master";
inline std::string optim_section(const std::string& state) { return "optim/" + state; }

// Checkpoint names: the first prepared model's tensors by module path (as
// a one-model run has always saved them), model k >= 1's under "model_<k>.".
inline std::string model_prefix(std::size_t index) {
  return index == 0 ? std::string() : "model_" + std::to_string(index) + ".";
}

// (checkpoint key, tensor) pairs a rank writes.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Every prepared parameter (and fp32 master copy) by its checkpoint name,
// keyed by TensorImpl.
using TensorNames = std::unordered_map<const void*, std::string>;

// The name of `t`; UsageError from `caller` when the optimizer holds a
// tensor that is neither a parameter of a prepared model nor a master copy.
const std::string& name_of(const TensorNames& names, const at::Tensor& t, const char* caller);

// `t` detached and flattened, as fragments are stored.
inline at::Tensor flat(const at::Tensor& t) { return t.detach().reshape({-1}); }

}  // namespace tandem::detail
