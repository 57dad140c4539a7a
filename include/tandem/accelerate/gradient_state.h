#pragma once
// GradientState: a read-only snapshot of what the Accelerator, its prepared
// optimizer, scheduler and loaders agree on about the current micro-step
// (Accelerate's GradientState). Accelerator::gradient_state() returns a copy;
// only the Accelerator's private micro-step controller changes the live
// state, through named transitions (src/accelerate/step_controller.h).
//
// A plain value: copy it, keep it, compare it. It does not follow later
// steps.

#include <cstdint>
#include <vector>

namespace tandem {

struct GradientState {
  // Micro-batches per optimizer step (gradient_accumulation_steps).
  int64_t accumulation_steps = 1;
  // Micro-steps begun since the last synchronised one.
  int64_t micro_step = 0;
  // Micro-steps begun since the optimizer last stepped (to catch a loop that
  // never calls Accelerator::backward() with accumulation on).
  int64_t micro_steps_since_step = 0;
  // True when the current micro-step ends an accumulation cycle: gradients
  // are all-reduced in its backward and the optimizer really steps.
  bool sync_gradients = true;
  // An accumulate() guard has begun the current micro-step.
  bool in_accumulate_guard = false;
  // The prepared loader has just handed out the last batch of its pass.
  bool end_of_dataloader = false;
  // Real optimizer steps taken (skipped ones not counted).
  int64_t optimizer_steps = 0;
  // The last call to the prepared optimizer's step() changed nothing
  // (a micro-step without sync, or an overflow skip).
  bool last_step_skipped = false;
  // Accelerator::backward() has added gradients that no optimizer step has
  // consumed yet: zero_grad() must keep them (they are being accumulated).
  bool gradients_pending = false;
  // clip_grad_norm() already ran for the pending step.
  bool clipped_this_step = false;

  // The batch most recently fetched from any prepared loader, for
  // gather_for_metrics(): rows per rank that are real samples rather than
  // even-batch padding. Empty when there is no padding to remove or no pass
  // is active. Like Accelerate's GradientState it follows the latest loader:
  // an evaluation pass run in the middle of a training epoch takes it over
  // (and clears end_of_dataloader when it ends), so evaluate between
  // optimizer steps, not between backward() and step().
  std::vector<int64_t> real_rows_per_rank;
  int64_t batch_rows = 0;

  // Join mode (Accelerator::join_uneven_inputs()). A JoinGuard is alive:
  // passes of prepared loaders that start now run joined (no padding; ranks
  // out of data take shadow steps until every rank is).
  bool join_requested = false;
  // The current batch comes from a joined pass. The three fields below are
  // meaningful only then; every rank holds the same values but shadow_batch.
  bool joining = false;
  // This rank has no real batch left: the current batch is a stand-in (its
  // last real one). Its gradient counts as zero and gather_for_metrics()
  // drops its rows; skip logging it. Always false outside join mode.
  bool shadow_batch = false;
  // Ranks with a real batch at this step (K >= 1): the step's gradient is the
  // mean over these ranks only.
  int64_t ranks_with_data = 0;
  // Per rank: 1 when its current batch is a shadow one.
  std::vector<uint8_t> shadow_ranks;
};

}  // namespace tandem
