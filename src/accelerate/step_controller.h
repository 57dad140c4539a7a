#pragma once
// StepController: the one owner of the micro-step state (GradientState).
// The Accelerator, its prepared optimizer, schedulers and loaders share one
// controller and change the state only through its named transitions, so
// the accumulation rules live in one place:
//
//   begin_micro_step   a backward (or an accumulate() guard) starts a
//                      micro-step: decides whether it synchronises gradients
//                      and switches DDP / ZeRO stage 1 to match
//   after_backward     gradients were added that no step has consumed
//   optimizer_step     a prepared optimizer stepped (or skipped), ending
//                      its step's flags
//   zero_grad          a prepared optimizer asks whether to zero now
//   next_batch         a prepared loader handed out a batch
//   end_of_pass        a prepared loader finished its pass
//
// Several optimizers share one controller (GANs, actor-critic): the
// micro-step schedule is common to all of them, and each optimizer has a
// record of its own accumulation cycle (OptimizerRecord), addressed by the
// id add_optimizer() gave it.
//
// Public code sees a read-only GradientState snapshot. Not thread-safe: the
// training thread changes it; autograd hooks of the same backward read it.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/accelerate/gradient_state.h"

namespace tandem {


namespace detail {

// What a prepared loader reports about the batch it just handed out.
struct BatchReport {
  bool last_of_pass = false;
  int64_t rows = 0;
  // Rows per rank that are real samples (not even-batch padding); empty:
  // every row is real.
  std::vector<int64_t> real_rows_per_rank;
  // A joined pass (join_uneven_inputs): per rank, 1 when its batch is a
  // shadow one, and this rank's index in it. Empty outside join mode.
  std::vector<uint8_t> shadow_ranks;
  int rank = 0;
};

// One prepared optimizer's accumulation cycle.
struct OptimizerRecord {
  int64_t steps = 0;           // real steps taken (skipped ones not counted)
  int64_t begun_at_step = 0;   // micro_steps_begun() at its last step
  // The backwards counted when zero_grad() last zeroed, if it did since the
  // last real or skipped step.
  std::optional<int64_t> zeroed_at_backward;
  bool deferred = false;       // step() deferred (no sync) since its last real or skipped step
  bool clipped = false;        // clip_grad_norm() ran for the pending step
  // Its last synchronising step() found inf/NaN gradients (Accelerate's
  // step_was_skipped: micro-steps in between leave it as it was).
  bool last_sync_skipped = false;
  // The last step() changed nothing: a deferred one since, or an overflow.
  bool last_step_skipped() const { return deferred || last_sync_skipped; }
};

class StepController {
 public:
  explicit StepController(int64_t accumulation_steps = 1);

  const GradientState& state() const { return state_; }

  // Configuration (prepare time).
  void set_accumulation_steps(int64_t steps);
  // Accelerate's GradientAccumulationPlugin switches. with_dataloader: the
  // last batch of a pass ends the accumulation cycle (sync_with_dataloader).
  // each_batch: gradients are reduced in every micro-step's backward, the
  // optimizer still steps once per cycle (sync_each_batch).
  void set_sync_rules(bool with_dataloader, bool each_batch) {
    sync_with_dataloader_ = with_dataloader;
    sync_each_batch_ = each_batch;
  }
  // Something whose gradient sync follows sync_gradients (a model
  // strategy's DDP or ZeRO optimizer): called with the new value at the
  // start of every micro-step. The function keeps what it needs alive, so a
  // micro-step begun through any handle reaches it while the handle lives.
  void attach_gradient_sync(std::function<void(bool)> set_sync) {
    sync_targets_.push_back(std::move(set_sync));
  }
  // Something that copies one rank's buffers to the others (DDP): called
  // with each batch's source, the highest rank with a real batch in a
  // joined pass (PyTorch Join's authoritative rank), else 0.
  void attach_buffer_source(std::function<void(int)> set_source) {
    buffer_sources_.push_back(std::move(set_source));
  }
  // A prepared optimizer joins; returns its id.
  int add_optimizer();
  const OptimizerRecord& optimizer(int id) const { return optimizers_.at(static_cast<size_t>(id)); }
  int num_optimizers() const { return static_cast<int>(optimizers_.size()); }
  // Micro-steps begun since the controller was made (never reset).
  int64_t micro_steps_begun() const { return micro_steps_begun_; }
  // Micro-steps begun since optimizer `id` last stepped.
  int64_t micro_steps_since_step(int id) const {
    return micro_steps_begun_ - optimizer(id).begun_at_step;
  }

  // ---- Micro-steps ----
  // Begins a micro-step: the last batch of a pass, and every
  // accumulation_steps-th micro-step, synchronise gradients.
  void begin_micro_step();
  // An accumulate() guard opens: begins the micro-step unless an outer guard
  // already did. Returns whether one was open (for leave_accumulate_guard).
  bool enter_accumulate_guard();
  void leave_accumulate_guard(bool outer_was_open) { state_.in_accumulate_guard = outer_was_open; }
  // Accelerator::backward() added gradients: begins a micro-step first when
  // no guard did.
  void before_backward();
  void after_backward() {
    gradients_pending_ = true;
    ++backwards_;
  }
  // Accelerator::backward() added gradients that no optimizer step has
  // consumed yet: zero_grad() must keep them (they are being accumulated),
  // and a checkpoint taken now would lose them.
  bool gradients_pending() const { return gradients_pending_; }

  // ---- Optimizer steps (per optimizer id) ----
  // step() on a micro-step that does not synchronise: nothing changes.
  void step_deferred(int id);
  void note_clipped(int id);
  // The synchronising step is over: `taken` when the update ran (false: an
  // overflow skipped it). The accumulated gradients are consumed either way.
  void optimizer_step(int id, bool taken);
  // The per-step flags end (also when the step threw).
  void end_step(int id);
  // zero_grad() on optimizer `id`: true when it should zero now. Not after a
  // deferred step() of this cycle (the gradients are partial sums), and not
  // again once it zeroed while the cycle accumulates, until its next
  // synchronising step. So the call may sit at the top or the bottom of the
  // loop body, and a second optimizer's zero_grad() clears its own stale
  // gradients even after another optimizer's backward began the micro-step.
  // Once a synchronising backward ran since it zeroed, it zeroes again, as
  // torch's and Accelerate's do: a GAN's generator backward writes into the
  // discriminator, whose zero_grad() must clear that.
  bool zero_grad(int id);

  // ---- Data ----
  void next_batch(BatchReport report);
  void end_of_pass();
  void begin_join();
  void end_join() { join_requested_ = false; }
  // A JoinGuard is alive: passes of prepared loaders that start now run
  // joined (no padding; ranks out of data take shadow steps).
  bool join_requested() const { return join_requested_; }
  // The batch most recently handed out by any prepared loader (for
  // gather_for_metrics()); empty outside a pass.
  const BatchReport& batch() const { return batch_; }

  // ---- Step boundaries ----
  // `hook` runs at step boundaries (empty: none): see at_step_boundary().
  void set_boundary_hook(std::function<void()> hook) { boundary_hook_ = std::move(hook); }
  // A prepared loader is about to hand out a batch, or the program called
  // Accelerator::preemption_point(): runs the hook when a micro-step began
  // since it last ran and no gradients are pending (an optimizer step
  // consumed them), outside join mode. Every rank reaches the same
  // boundaries, so a hook may be collective.
  void at_step_boundary();

  // ---- Checkpoints ----
  // load_state(): the step counters of the checkpoint (one per optimizer;
  // missing ones take `optimizer_steps`), between steps.
  void restore(int64_t optimizer_steps, const std::vector<int64_t>& per_optimizer = {});

 private:
  void clear_batch();
  OptimizerRecord& record(int id);

  GradientState state_;
  BatchReport batch_;
  bool gradients_pending_ = false;
  int64_t backwards_ = 0;  // after_backward() calls, never reset
  bool join_requested_ = false;
  int64_t micro_steps_begun_ = 0;
  int64_t boundary_seen_at_ = 0;  // micro_steps_begun_ when the boundary hook last ran
  std::function<void()> boundary_hook_;
  std::vector<OptimizerRecord> optimizers_;
  std::vector<std::function<void(bool)>> sync_targets_;
  std::vector<std::function<void(int)>> buffer_sources_;
  bool sync_with_dataloader_ = true;
  bool sync_each_batch_ = false;
};

}  // namespace detail
}  // namespace tandem
