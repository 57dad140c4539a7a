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

#include "tandem/accelerate/accelerator.h"

#include "accelerate/accelerator_impl.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "core/torch_internals.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {

Accelerator::JoinGuard::JoinGuard(std::shared_ptr<detail::StepController> controller)
    : controller_(std::move(controller)) {
  controller_->begin_join();
}

Accelerator::JoinGuard::~JoinGuard() { controller_->end_join(); }

Accelerator::JoinGuard Accelerator::join_uneven_inputs() {
  return JoinGuard(impl_->prepared.controller());
}

void Accelerator::Impl::install_shadow_hooks() {
  // Installed once, after DDP/ZeRO took hold of the same accumulators. Each
  // runs before AccumulateGrad: on a shadow step the incoming gradient is
  // replaced by zeros, so the reducer hooks that fire after accumulation
  // still run (and launch the same collectives) with a zero contribution.
  // The controller is held weakly: DDP's reducer keeps these accumulators
  // alive, and the controller keeps the reducer alive.
  join_hooks = std::make_unique<detail::JoinHooks>();
  const std::weak_ptr<const detail::StepController> weak = prepared.controller();
  for (const auto& model : prepared.models()) {
    for (const auto& param : unique_parameters(*model.module)) {
      if (!param.requires_grad()) continue;
      join_hooks->hooks.push_back(
          internals::add_grad_pre_hook(param, [weak](const at::Tensor& grad) {
            const auto controller = weak.lock();
            const bool shadow = controller != nullptr && controller->state().shadow_batch;
            return shadow && grad.defined() ? at::zeros_like(grad) : grad;
          }));
    }
  }
}

double Accelerator::Impl::join_gradient_weight() {
  TANDEM_CHECK_ARG(!prepared.models().empty(),
                   "Accelerator::backward in a joined pass: no model was prepared, so shadow "
                   "steps cannot be made to contribute zero gradient. Prepare the model "
                   "(prepare() or prepare_model()) before training under "
                   "join_uneven_inputs()");
  if (join_hooks == nullptr) install_shadow_hooks();
  const GradientState& state = prepared.controller()->state();
  if (state.shadow_batch) return 1.0;  // the hooks zero it anyway
  const int64_t k = state.ranks_with_data;
  const int world = group->world_size();
  TANDEM_CHECK(k >= 1 && k <= world, "join: {} ranks with data out of {}", k, world);
  return static_cast<double>(world) / static_cast<double>(k);
}

}  // namespace tandem
