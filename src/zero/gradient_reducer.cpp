// Backward under ZeRO: hooks count each group's gradients in, and complete
// groups are handed to the policy and launched on the communication thread
// strictly in group order, so every rank issues the same collectives in the
// same sequence.

#include "zero/gradient_reducer.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "parallel/backward_callbacks.h"
#include "parallel/checkpoint_context.h"
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
  arrivals_.assign(layout_.params().size(), 0);
  expected_.assign(layout_.params().size(), 1);
  packed_.assign(layout_.groups().size(), false);
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
    std::fill(arrivals_.begin(), arrivals_.end(), 0);
    std::fill(packed_.begin(), packed_.end(), false);
    late_.clear();
    const std::uint64_t checkpointed = checkpointed_forwards();
    counting_ = !counted_ && checkpointed != checkpointed_seen_;
    if (counting_) checkpointed_seen_ = checkpointed;
  }
  const int arrived = ++arrivals_[index];
  if (arrived < expected_[index] && !counting_) return;  // more passes to come
  if (arrived > 1 && (counting_ || arrived > expected_[index])) {
    on_late_gradient(index);
    return;
  }
  readiness_.mark_ready(index);
  policy_->gradient_ready(index);
  if (readiness_.arrive(index)) {
    const std::size_t group = layout_.group_of()[index];
    policy_->group_complete(group);
    packed_[group] = true;
    // Without overlap_comm the groups wait for the end of backward, and so
    // do they while the firings are counted.
    if (overlap_comm_ && !counting_) launch_ready_groups();
  }
}

void GradientReducer::on_late_gradient(std::size_t index) {
  const std::size_t group = layout_.group_of()[index];
  if (group < readiness_.launched()) {
    late_.push_back(index);  // reported when backward ends
    return;
  }
  // Not launched: the gradient is still this rank's to add. Before its group
  // is packed autograd accumulated it where the first one is; after, it goes
  // into the pack.
  if (packed_[group]) policy_->add_late_gradient(index);
  if (!counting_) expected_[index] = arrivals_[index];
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
  // Parameters that got no gradient this time contribute zeros, and those
  // that got fewer than counted what they got; their groups launch now, in
  // order, on every rank.
  for (std::size_t i : readiness_.unready()) {
    policy_->gradient_ready(i);
    if (readiness_.arrive(i)) policy_->group_complete(layout_.group_of()[i]);
  }
  launch_ready_groups();
  clock_.drain(queue_);
  policy_->end_backward();
  if (counting_) {
    for (std::size_t i = 0; i < arrivals_.size(); ++i) expected_[i] = std::max(1, arrivals_[i]);
    counted_ = true;
    counting_ = false;
  }
  if (!late_.empty()) throw_late_gradients();
}

void GradientReducer::throw_late_gradients() const {
  std::string list;
  for (std::size_t k = 0; k < late_.size() && k < 10; ++k) {
    const std::size_t i = late_[k];
    list += fmt::format("{}{} ({} gradients, {} counted)", k ? ", " : "", layout_.name(i),
                        arrivals_[i], expected_[i]);
  }
  TANDEM_THROW(UsageError,
               "ZeroOptimizer: parameter(s) {} received more gradients in this backward than "
               "ZeRO counted in the first backward with checkpointed blocks, after their group "
               "had been reduced: the step would miss the later ones. A block run through "
               "tandem::checkpoint gives its parameters one gradient per call; call each "
               "checkpointed block the same number of times in every forward",
               list);
}

}  // namespace tandem::detail
