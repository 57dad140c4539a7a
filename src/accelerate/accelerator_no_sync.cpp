// Accelerator::no_sync: gradient synchronisation off for one prepared model
// while a guard lives. The model strategy owns the switch (DDP's or ZeRO
// stage 1's); the micro-step controller keeps setting it at every micro-step,
// and the strategy ANDs that with "no guard alive", so a backward begun
// inside the guard never communicates.

#include "accelerate/accelerator_impl.h"
#include "accelerate/model_strategy.h"
#include "accelerate/step_controller.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {

Accelerator::NoSyncGuard::NoSyncGuard(std::shared_ptr<detail::ModelStrategy> strategy,
                                      std::shared_ptr<detail::StepController> controller)
    : strategy_(std::move(strategy)), controller_(std::move(controller)) {}

Accelerator::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : strategy_(std::move(other.strategy_)), controller_(std::move(other.controller_)) {}

Accelerator::NoSyncGuard::~NoSyncGuard() {
  // The switch goes back to what the current micro-step decided; the next
  // micro-step sets it again anyway.
  if (strategy_) strategy_->leave_no_sync(controller_->state().sync_gradients);
}

Accelerator::NoSyncGuard Accelerator::no_sync_at(std::size_t index) {
  const std::shared_ptr<detail::ModelStrategy>& strategy =
      impl_->prepared.models().at(index).strategy;
  strategy->enter_no_sync(index);
  return NoSyncGuard(strategy, impl_->prepared.controller());
}

}  // namespace tandem
