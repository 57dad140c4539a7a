#pragma once
// GradientState: a read-only snapshot of what the Accelerator, its prepared
// optimizer, scheduler and loaders agree on about the current micro-step
// (Accelerate's GradientState). Accelerator::gradient_state() returns a copy;
// only the Accelerator's private micro-step controller changes the live
// state, through named transitions (src/accelerate/step_controller.h).
//
// A plain value: copy it, keep it, compare it. It does not follow later
// steps. It holds what a training loop reads; the library's own bookkeeping
// (gradients awaiting a step, the padding rows of the current batch,
// per-optimizer flags) stays inside the controller.

#include <cstdint>

namespace tandem {

struct GradientState {
  // Micro-batches per optimizer step (gradient_accumulation_steps).
  int64_t accumulation_steps = 1;
  // Micro-steps begun since the last synchronised one.
  int64_t micro_step = 0;
  // True when the current micro-step ends an accumulation cycle: gradients
  // are all-reduced in its backward and the optimizer really steps.
  bool sync_gradients = true;
  // An accumulate() guard has begun the current micro-step.
  bool in_accumulate_guard = false;
  // The prepared loader has just handed out the last batch of its pass.
  // Like Accelerate's GradientState it follows the latest loader: an
  // evaluation pass run in the middle of a training epoch takes it over
  // (and clears it when it ends), so evaluate between optimizer steps, not
  // between backward() and step().
  bool end_of_dataloader = false;
  // Real optimizer steps taken (skipped ones not counted); with several
  // optimizers, the most any of them took (Accelerator::step()). Whether an
  // optimizer's last step() was skipped is per optimizer:
  // AcceleratedOptimizer::step_was_skipped().
  int64_t optimizer_steps = 0;

  // Join mode (Accelerator::join_uneven_inputs()). The current batch comes
  // from a joined pass; the two fields below are meaningful only then.
  bool joining = false;
  // This rank has no real batch left: the current batch is a stand-in (its
  // last real one). Its gradient counts as zero and gather_for_metrics()
  // drops its rows; skip logging it. Always false outside join mode.
  bool shadow_batch = false;
  // Ranks with a real batch at this step (K >= 1): the step's gradient is the
  // mean over these ranks only. Every rank holds the same value.
  int64_t ranks_with_data = 0;
};

}  // namespace tandem
