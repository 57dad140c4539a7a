// Accelerator's Join mode for uneven inputs: the guard, the shadow-step
// gradient hooks, and the per-step gradient weight. The pass logic (who has
// data, stand-in batches) is PreparedLoader's, in prepared_loader_join.cpp.
//
// How the step's gradient becomes the mean over the K ranks with data,
// whatever the strategy: the reducers (DDP buckets, ZeRO's all-reduce or
// reduce-scatter) keep averaging over the world W; a shadow rank feeds
// exact zeros (the hooks below replace its gradients, so a NaN in the
// stand-in's loss cannot leak in the way 0 * NaN would), and a real rank
// weights its loss by W / K. Per micro-step, so under gradient accumulation
// each micro-step is the mean over its own K, and the step the mean of the
// micro-steps, as without join. With K == W the weight is 1 and nothing
// changes; with W / K a power of two the weighting is exact.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {
namespace {

// Runs before AccumulateGrad: on a shadow step the incoming gradient is
// replaced by zeros, so the reducer hooks that fire after accumulation still
// run (and launch the same collectives) with a zero contribution.
class ShadowGradientHook : public torch::autograd::FunctionPreHook {
 public:
  explicit ShadowGradientHook(std::shared_ptr<const GradientState> state)
      : state_(std::move(state)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (!state_->shadow_batch) return grads;
    torch::autograd::variable_list zeros;
    zeros.reserve(grads.size());
    for (const auto& g : grads) zeros.push_back(g.defined() ? at::zeros_like(g) : g);
    return zeros;
  }

 private:
  std::shared_ptr<const GradientState> state_;
};

}  // namespace

Accelerator::JoinGuard::JoinGuard(GradientState& state) : state_(state) {
  state_.join_requested = true;
}

Accelerator::JoinGuard::~JoinGuard() { state_.join_requested = false; }

Accelerator::JoinGuard Accelerator::join_uneven_inputs() {
  TANDEM_CHECK_ARG(!state_->join_requested,
                   "Accelerator::join_uneven_inputs: a guard is already alive. Keep one guard "
                   "around the training loop (it covers every epoch started inside it)");
  return JoinGuard(*state_);
}

void Accelerator::install_shadow_hooks() {
  // Installed once, after DDP/ZeRO took hold of the same accumulators (the
  // parameter itself holds its accumulator only weakly: keep ours alive too).
  for (const auto& param : unique_parameters(*model_)) {
    if (!param.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(param);
    TANDEM_CHECK(accumulator != nullptr, "join: parameter without a gradient accumulator");
    accumulator->add_pre_hook(std::make_unique<ShadowGradientHook>(state_));
    join_accumulators_.push_back(std::move(accumulator));
  }
}

double Accelerator::join_gradient_weight() {
  TANDEM_CHECK_ARG(model_ != nullptr,
                   "Accelerator::backward in a joined pass: no model was prepared, so shadow "
                   "steps cannot be made to contribute zero gradient. Prepare the model "
                   "(prepare() or prepare_model()) before training under "
                   "join_uneven_inputs()");
  if (join_accumulators_.empty()) install_shadow_hooks();
  if (state_->shadow_batch) return 1.0;  // the hooks zero it anyway
  const int64_t k = state_->ranks_with_data;
  TANDEM_CHECK(k >= 1 && k <= num_processes(), "join: {} ranks with data out of {}", k,
               num_processes());
  return static_cast<double>(num_processes()) / static_cast<double>(k);
}

}  // namespace tandem
