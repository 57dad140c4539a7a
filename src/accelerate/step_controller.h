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
//   optimizer_step     the prepared optimizer stepped (or skipped), ending
//                      the step's flags
//   next_batch         a prepared loader handed out a batch
//   end_of_pass        a prepared loader finished its pass
//
// Public code sees a read-only GradientState snapshot. Not thread-safe: the
// training thread changes it; autograd hooks of the same backward read it.

#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/accelerate/gradient_state.h"

namespace tandem {

class DistributedDataParallel;
class ZeroOptimizer;

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

class StepController {
 public:
  explicit StepController(int64_t accumulation_steps = 1);

  const GradientState& state() const { return state_; }

  // Configuration (prepare time).
  void set_accumulation_steps(int64_t steps);
  // The wrapper whose gradient sync follows sync_gradients; shared, so a
  // micro-step begun through any handle reaches it while the handle lives.
  void attach(std::shared_ptr<DistributedDataParallel> ddp) { ddp_ = std::move(ddp); }
  void attach(std::shared_ptr<ZeroOptimizer> zero) { zero_ = std::move(zero); }

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
  void after_backward() { state_.gradients_pending = true; }

  // ---- Optimizer steps ----
  // step() on a micro-step that does not synchronise: nothing changes.
  void step_deferred() { state_.last_step_skipped = true; }
  void note_clipped() { state_.clipped_this_step = true; }
  // The synchronising step is over: `taken` when the update ran (false: an
  // overflow skipped it). The accumulated gradients are consumed either way.
  void optimizer_step(bool taken);
  // The per-step flags end (also when the step threw).
  void end_step();

  // ---- Data ----
  void next_batch(BatchReport report);
  void end_of_pass();
  void begin_join();
  void end_join() { state_.join_requested = false; }

  // ---- Checkpoints ----
  // load_state(): the step counter of the checkpoint, between steps.
  void restore(int64_t optimizer_steps);

 private:
  void clear_batch();

  GradientState state_;
  std::shared_ptr<DistributedDataParallel> ddp_;
  std::shared_ptr<ZeroOptimizer> zero_;
};

}  // namespace detail
}  // namespace tandem
