// Backward under ZeRO: hooks count each group's gradients in, and complete
// groups are handed to the policy and launched on the communication thread
// strictly in group order, so every rank issues the same collectives in the
// same sequence.

#include "zero/gradient_reducer.h"

#include "parallel/backward_callbacks.h"
#include "tandem/core/error.h"

namespace tandem::detail {

GradientReducer::GradientReducer(const ZeroLayout& layout, UnitGatherer& gatherer,
                                 ProcessGroup& pg, ProcessGroup* replicate, CommQueue& queue,
                                 CommClock& clock, const ZeroOptions& options)
    : layout_(layout),
      queue_(queue),
      clock_(clock),
      overlap_comm_(options.overlap_comm),
      policy_(make_reduction_policy(layout, gatherer, pg, replicate, queue, clock, options)) {
  readiness_.reset(layout_.group_of(), layout_.groups().size());
  for (std::size_t i = 0; i < layout_.params().size(); ++i) {
    grad_hooks_.push_back(
        internals::add_grad_ready_hook(layout_.params()[i], [this, i] { on_grad_ready(i); }));
  }
}

bool GradientReducer::in_backward() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return readiness_.in_backward();
}

void GradientReducer::set_gradient_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward(), "ZeroOptimizer::set_gradient_sync() called during backward");
  sync_enabled_ = enabled;
}

void GradientReducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.drain();
  policy_->zero_grad();
}

void GradientReducer::on_grad_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Not reduced (no_sync under the flat all-reduce): no backward starts, so
  // the gradients simply accumulate where autograd puts them.
  if (!policy_->reduces_backward(sync_enabled_)) return;
  if (readiness_.start_if_idle()) {
    // Not Engine::queue_callback: inside a checkpointed block's nested
    // backward that would finalize when the block's backward ends, not the
    // model's.
    queue_end_of_backward([this] { finalize_backward(); });
  }
  if (!readiness_.mark_ready(index)) return;
  policy_->gradient_ready(index);
  if (readiness_.arrive(index)) {
    policy_->group_complete(layout_.group_of()[index]);
    // Without overlap_comm the groups wait for the end of backward.
    if (overlap_comm_) launch_ready_groups();
  }
}

void GradientReducer::launch_ready_groups() {
  readiness_.launch_ready([this](std::size_t g) {
    if (readiness_.in_backward()) {
      clock_.count(&ZeroOptimizer::CommStats::reductions_launched_in_backward);
    }
    policy_->launch(g);
  });
}

void GradientReducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  readiness_.finish();
  // Parameters that got no gradient this time contribute zeros; their
  // groups launch now, in order, on every rank.
  for (std::size_t i : readiness_.unready()) {
    policy_->gradient_ready(i);
    if (readiness_.arrive(i)) policy_->group_complete(layout_.group_of()[i]);
  }
  launch_ready_groups();
  clock_.drain(queue_);
  policy_->end_backward();
}

}  // namespace tandem::detail
