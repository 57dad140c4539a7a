// Adam and AdamW through PyTorch's fused multi-tensor kernels (fused_adam.h).

#include "optim/fused_adam.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <typeinfo>
#include <unordered_set>
#include <vector>

#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

// TANDEM_FUSED_ADAM: unset or 1 (on), 0 (LibTorch's own loop).
bool fused_adam_enabled() {
  static const bool on = [] {
    const char* value = std::getenv("TANDEM_FUSED_ADAM");
    if (value == nullptr) return true;
    TANDEM_CHECK_ARG(std::strcmp(value, "0") == 0 || std::strcmp(value, "1") == 0,
                     "TANDEM_FUSED_ADAM={}: expected 1 (fused Adam/AdamW steps on the GPU, the "
                     "default) or 0 (LibTorch's per-parameter loop)",
                     value);
    return std::strcmp(value, "1") == 0;
  }();
  return on;
}

// The kernels want every tensor of a parameter alike and dense.
bool same_layout(const at::Tensor& t, const at::Tensor& p) {
  return t.defined() && t.layout() == at::kStrided && t.scalar_type() == p.scalar_type() &&
         t.device() == p.device() && t.sizes() == p.sizes() && t.strides() == p.strides();
}

bool fusable_dtype(at::ScalarType type) {
  return type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16;
}

// The parameters of one launch: one group, device, dtype and step count.
struct Bucket {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<torch::optim::OptimizerParamState*> states;
};
using BucketKey = std::tuple<int, int, int, int64_t>;  // device type, index, dtype, step

template <class Options, class State>
bool can_fuse(torch::optim::Optimizer& optimizer, bool any_device) {
  std::unordered_set<void*> seen;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!seen.insert(p.unsafeGetTensorImpl()).second) return false;  // listed twice
      if (!any_device && !p.is_cuda()) return false;
      if (p.layout() != at::kStrided || !p.is_non_overlapping_and_dense() ||
          !fusable_dtype(p.scalar_type()) || !same_layout(with_strides_of(p, p.grad()), p)) {
        return false;
      }
      auto found = optimizer.state().find(p.unsafeGetTensorImpl());
      if (found == optimizer.state().end()) continue;
      auto& state = static_cast<State&>(*found->second);
      if (!same_layout(state.exp_avg(), p) || !same_layout(state.exp_avg_sq(), p)) return false;
      if (options.amsgrad() && !same_layout(state.max_exp_avg_sq(), p)) return false;
    }
  }
  return true;
}

template <class Options, class State>
bool fused_step(torch::optim::Optimizer& optimizer, bool decoupled, bool any_device) {
  if (!can_fuse<Options, State>(optimizer, any_device)) return false;
  torch::NoGradGuard no_grad;
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    std::map<BucketKey, Bucket> buckets;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = states[p.unsafeGetTensorImpl()];
      if (!slot) {  // as LibTorch's step() starts a parameter's state
        auto state = std::make_unique<State>();
        state->step(0);
        state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (options.amsgrad()) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<State&>(*slot);
      Bucket& bucket = buckets[{static_cast<int>(p.device().type()), p.device().index(),
                                static_cast<int>(p.scalar_type()), state.step()}];
      bucket.params.push_back(p);
      bucket.grads.push_back(with_strides_of(p, p.grad()));
      bucket.exp_avgs.push_back(state.exp_avg());
      bucket.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) bucket.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      bucket.states.push_back(&state);
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [key, bucket] : buckets) {
      const int64_t step = std::get<3>(key) + 1;
      // The kernels read the (already incremented) step from an fp32 tensor
      // on the parameters' device; every parameter here shares one.
      const at::Tensor step_tensor =
          at::full({}, static_cast<double>(step),
                   at::TensorOptions().dtype(at::kFloat).device(bucket.params[0].device()));
      const std::vector<at::Tensor> steps(bucket.params.size(), step_tensor);
      if (decoupled) {
        at::_fused_adamw_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs,
                          bucket.max_exp_avg_sqs, steps, options.lr(), beta1, beta2,
                          options.weight_decay(), options.eps(), options.amsgrad(),
                          /*maximize=*/false);
      } else {
        at::_fused_adam_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs,
                         bucket.max_exp_avg_sqs, steps, options.lr(), beta1, beta2,
                         options.weight_decay(), options.eps(), options.amsgrad(),
                         /*maximize=*/false);
      }
      for (auto* state : bucket.states) static_cast<State*>(state)->step(step);
    }
  }
  return true;
}

}  // namespace

bool try_fused_adam_step(torch::optim::Optimizer& optimizer, bool any_device) {
  if (!fused_adam_enabled()) return false;
  // Exactly LibTorch's classes: a subclass may have changed step().
  if (typeid(optimizer) == typeid(torch::optim::AdamW)) {
    return fused_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
        optimizer, /*decoupled=*/true, any_device);
  }
  if (typeid(optimizer) == typeid(torch::optim::Adam)) {
    return fused_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(
        optimizer, /*decoupled=*/false, any_device);
  }
  return false;
}

}  // namespace tandem::detail
