#include "accelerate/step_controller.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::detail {

StepController::StepController(int64_t accumulation_steps) {
  set_accumulation_steps(accumulation_steps);
}

void StepController::set_accumulation_steps(int64_t steps) {
  TANDEM_CHECK_ARG(steps >= 1, "Accelerator: gradient_accumulation_steps must be >= 1, got {}",
                   steps);
  state_.accumulation_steps = steps;
}

int StepController::add_optimizer() {
  OptimizerRecord r;
  r.begun_at_step = micro_steps_begun_;
  r.steps = state_.optimizer_steps;  // one prepared after training began starts level
  optimizers_.push_back(r);
  return static_cast<int>(optimizers_.size()) - 1;
}

OptimizerRecord& StepController::record(int id) {
  TANDEM_CHECK(id >= 0 && id < num_optimizers(), "StepController: no optimizer {}", id);
  return optimizers_[static_cast<size_t>(id)];
}

void StepController::begin_micro_step() {
  ++micro_steps_begun_;
  ++state_.micro_step;
  // The last batch of a pass synchronises (unless sync_with_dataloader is
  // off), so an epoch whose length is not a multiple of the accumulation
  // steps never leaks partial sums into the next epoch.
  state_.sync_gradients = (sync_with_dataloader_ && state_.end_of_dataloader) ||
                          state_.micro_step % state_.accumulation_steps == 0;
  if (state_.sync_gradients) state_.micro_step = 0;
  const bool reduce = state_.sync_gradients || sync_each_batch_;
  for (const auto& set_sync : sync_targets_) set_sync(reduce);
}

bool StepController::enter_accumulate_guard() {
  const bool outer = state_.in_accumulate_guard;
  // A nested guard belongs to the micro-step the outer one began.
  if (!outer) begin_micro_step();
  state_.in_accumulate_guard = true;
  return outer;
}

void StepController::before_backward() {
  if (!state_.in_accumulate_guard) begin_micro_step();
}

void StepController::step_deferred(int id) {
  OptimizerRecord& r = record(id);
  r.deferred = true;
}

void StepController::note_clipped(int id) { record(id).clipped = true; }

void StepController::optimizer_step(int id, bool taken) {
  OptimizerRecord& r = record(id);
  if (taken) ++r.steps;
  r.last_sync_skipped = !taken;
  r.zeroed_at_backward.reset();
  r.deferred = false;
  r.begun_at_step = micro_steps_begun_;
  // Accelerator::step(): the most steps any optimizer took (a GAN's two
  // optimizers each step once per iteration).
  state_.optimizer_steps = std::max(state_.optimizer_steps, r.steps);
  gradients_pending_ = false;
}

void StepController::end_step(int id) { record(id).clipped = false; }

bool StepController::zero_grad(int id) {
  OptimizerRecord& r = record(id);
  if (r.deferred) return false;
  const bool zeroed = r.zeroed_at_backward.has_value();
  const bool fresh_sync_gradients =
      zeroed && backwards_ > *r.zeroed_at_backward && state_.sync_gradients;
  if (zeroed && !fresh_sync_gradients) return false;
  r.zeroed_at_backward = backwards_;
  return true;
}

void StepController::clear_batch() {
  state_.end_of_dataloader = false;
  state_.joining = false;
  state_.shadow_batch = false;
  state_.ranks_with_data = 0;
  batch_ = BatchReport{};
}

void StepController::next_batch(BatchReport report) {
  clear_batch();
  state_.end_of_dataloader = report.last_of_pass;
  batch_ = std::move(report);
  int source = 0;
  for (std::size_t r = 0; r < batch_.shadow_ranks.size(); ++r) {
    if (batch_.shadow_ranks[r] == 0) source = static_cast<int>(r);
  }
  for (const auto& set_source : buffer_sources_) set_source(source);
  if (batch_.shadow_ranks.empty()) return;
  int64_t with_data = 0;
  for (uint8_t shadow : batch_.shadow_ranks) with_data += shadow == 0 ? 1 : 0;
  state_.joining = true;
  state_.ranks_with_data = with_data;
  state_.shadow_batch = batch_.shadow_ranks.at(static_cast<size_t>(batch_.rank)) != 0;
}

void StepController::end_of_pass() { clear_batch(); }

void StepController::at_step_boundary() {
  if (!boundary_hook_ || gradients_pending_ || join_requested_ ||
      micro_steps_begun_ == boundary_seen_at_) {
    return;
  }
  boundary_seen_at_ = micro_steps_begun_;
  boundary_hook_();
}

void StepController::begin_join() {
  TANDEM_CHECK_ARG(!join_requested_,
                   "Accelerator::join_uneven_inputs: a guard is already alive. Keep one guard "
                   "around the training loop (it covers every epoch started inside it)");
  join_requested_ = true;
}

void StepController::restore(int64_t optimizer_steps, const std::vector<int64_t>& per_optimizer) {
  for (std::size_t i = 0; i < optimizers_.size(); ++i) {
    OptimizerRecord& r = optimizers_[i];
    r.steps = i < per_optimizer.size() ? per_optimizer[i] : optimizer_steps;
    r.begun_at_step = micro_steps_begun_;
    r.zeroed_at_backward.reset();
    r.deferred = false;
    r.clipped = false;
    r.last_sync_skipped = false;
  }
  state_.optimizer_steps = optimizer_steps;
  state_.micro_step = 0;
  gradients_pending_ = false;
}

}  // namespace tandem::detail
