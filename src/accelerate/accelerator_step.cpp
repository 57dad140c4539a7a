// Accelerator: backward and gradient accumulation, clipping, and what the
// micro-step controller says about the current step.

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include "accelerate/accelerator_impl.h"
#include "accelerate/model_strategy.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/amp/autocast.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {

int64_t Accelerator::gradient_accumulation_steps() const {
  return impl_->prepared.controller()->state().accumulation_steps;
}

GradientState Accelerator::gradient_state() const { return impl_->prepared.controller()->state(); }

bool Accelerator::sync_gradients() const {
  return impl_->prepared.controller()->state().sync_gradients;
}

int64_t Accelerator::step() const { return impl_->prepared.controller()->state().optimizer_steps; }

bool Accelerator::optimizer_step_was_skipped() const {
  const detail::StepController& controller = *impl_->prepared.controller();
  for (int id = 0; id < controller.num_optimizers(); ++id) {
    if (controller.optimizer(id).last_sync_skipped) return true;
  }
  return false;
}

bool Accelerator::is_shadow_batch() const {
  return impl_->prepared.controller()->state().shadow_batch;
}

int64_t Accelerator::ranks_with_data() const {
  const GradientState& state = impl_->prepared.controller()->state();
  return state.joining ? state.ranks_with_data : num_processes();
}

double Accelerator::loss_scale() const { return impl_->scaler->scale(); }
int64_t Accelerator::skipped_steps() const { return impl_->scaler->skipped_steps(); }
LossScaler& Accelerator::loss_scaler() const { return *impl_->scaler; }

AutocastGuard Accelerator::autocast() const {
  return AutocastGuard(impl_->device.type(), impl_->config.mixed_precision);
}

namespace {

// Across ranks, a prepared optimizer that steps a parameter no prepared
// model holds updates it from this rank's gradient alone: the ranks' copies
// drift apart in silence. Under ZeRO prepare_optimizer refuses it already;
// here the order of prepare calls is free, so it is checked at the first
// backward. An fp32 master copy counts as the parameter it stands for.
void check_optimizers_step_prepared_models(detail::PreparedObjects& prepared, int world_size,
                                           bool sharded) {
  if (world_size == 1 || sharded) return;
  std::unordered_set<const void*> held;
  for (const auto& model : prepared.models()) {
    for (const auto& p : unique_parameters(*model.module)) held.insert(p.unsafeGetTensorImpl());
  }
  for (const MasterWeights* masters : prepared.master_weights()) {
    for (std::size_t i = 0; i < masters->model_params().size(); ++i) {
      if (held.count(masters->model_params()[i].unsafeGetTensorImpl())) {
        held.insert(masters->master_params()[i].unsafeGetTensorImpl());
      }
    }
  }
  for (std::size_t o = 0; o < prepared.optimizers().size(); ++o) {
    for (const auto& p : unique_optimizer_parameters(*prepared.optimizers()[o])) {
      TANDEM_CHECK_ARG(held.count(p.unsafeGetTensorImpl()),
                       "Accelerator::backward: prepared optimizer {} steps a parameter of shape "
                       "[{}] that no prepared model holds, so its gradient is not averaged "
                       "across the {} ranks and each rank would update its own copy apart from "
                       "the others. Prepare the model that owns it (prepare_model), or leave "
                       "that parameter out of the optimizer",
                       o, fmt::join(p.sizes(), ", "), world_size);
    }
  }
}

}  // namespace

void Accelerator::backward(const at::Tensor& loss) {
  TANDEM_CHECK_ARG(loss.defined() && loss.numel() == 1,
                   "Accelerator::backward: the loss must be a scalar tensor, got shape {}",
                   loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
  Impl& s = *impl_;
  const std::shared_ptr<detail::WallClockTimer>& timer = s.trackers->timer();
  detail::StepController& controller = *s.prepared.controller();
  if (timer) timer->before_backward();
  // The DeepSpeed monitors' train_loss (a host sync, only when one is on).
  if (s.trackers->wants_losses()) s.trackers->add_loss(loss.detach().item<double>());
  for (const auto& optimizer : s.prepared.optimizers()) {
    detail::PreparedAccess::core(*optimizer).check_wrapped(*optimizer);
  }
  if (!s.models_checked) {
    // A model that cannot train as prepared (a sharded one with no
    // optimizer over its trainable parameters) is refused before its
    // gradients go astray.
    for (std::size_t i = 0; i < s.prepared.models().size(); ++i) {
      s.prepared.models()[i].strategy->check_ready(i);
    }
    check_optimizers_step_prepared_models(s.prepared, s.group->world_size(),
                                          s.strategies->binds_optimizers());
    s.models_checked = true;
  }
  controller.before_backward();
  // A loss computed under autocast may be bf16/fp16; backward starts in fp32
  // (Accelerate casts model outputs back to fp32 for the same reason).
  at::Tensor scaled = to_fp32(loss);
  const GradientState& state = controller.state();
  double factor = 1.0 / static_cast<double>(state.accumulation_steps);
  if (state.joining) factor *= s.join_gradient_weight();
  if (s.scaler->enabled()) factor *= s.scaler->scale();
  if (factor != 1.0) scaled = scaled * factor;
  scaled.backward();
  controller.after_backward();
  for (const auto& optimizer : s.prepared.optimizers()) {
    detail::PreparedAccess::core(*optimizer).note_backward(*optimizer);
  }
  if (timer) timer->after_backward();
}

Accelerator::AccumulateGuard::AccumulateGuard(std::shared_ptr<detail::StepController> controller)
    : controller_(std::move(controller)), outer_was_open_(controller_->enter_accumulate_guard()) {}

Accelerator::AccumulateGuard::~AccumulateGuard() {
  controller_->leave_accumulate_guard(outer_was_open_);
}

Accelerator::AccumulateGuard Accelerator::begin_accumulate() {
  return AccumulateGuard(impl_->prepared.controller());
}

double Accelerator::clip_grad_norm(double max_norm, double norm_type) {
  AcceleratedOptimizer& optimizer = impl_->prepared.only_optimizer("clip_grad_norm");
  if (!sync_gradients()) return std::numeric_limits<double>::quiet_NaN();
  // DDP gradients are identical on every rank after the all-reduce, so the
  // local norm is the global one.
  return detail::PreparedAccess::core(optimizer).clip(optimizer, max_norm, norm_type);
}

double Accelerator::clip_grad_norm(const std::shared_ptr<AcceleratedOptimizer>& optimizer,
                                   double max_norm, double norm_type) {
  const auto& optimizers = impl_->prepared.optimizers();
  TANDEM_CHECK_ARG(optimizer != nullptr &&
                       std::find(optimizers.begin(), optimizers.end(), optimizer) !=
                           optimizers.end(),
                   "Accelerator::clip_grad_norm: the optimizer given was not prepared by this "
                   "Accelerator");
  if (!sync_gradients()) return std::numeric_limits<double>::quiet_NaN();
  return detail::PreparedAccess::core(*optimizer).clip(*optimizer, max_norm, norm_type);
}

void Accelerator::clip_grad_value(double clip_value) {
  TANDEM_CHECK_ARG(clip_value > 0 && std::isfinite(clip_value),
                   "Accelerator::clip_grad_value: clip_value must be a positive finite number, "
                   "got {}",
                   clip_value);
  TANDEM_CHECK_ARG(!impl_->prepared.optimizers().empty(),
                   "Accelerator::clip_grad_value: no optimizer is prepared; it clamps the "
                   "gradients of the prepared optimizers' parameters");
  if (!sync_gradients()) return;
  for (const auto& optimizer : impl_->prepared.optimizers()) {
    detail::PreparedAccess::core(*optimizer).clip_value(*optimizer, clip_value);
  }
}

}  // namespace tandem
