#pragma once
// WallClockBreakdown: where the time of an optimizer step goes on this rank
// (DeepSpeed's wall_clock_breakdown), averaged over a window of optimizer
// steps. Accelerator::wall_clock() returns the last window's; the same
// numbers go to the trackers as wall_clock/forward_ms, wall_clock/backward_ms,
// wall_clock/step_ms and wall_clock/communication_ms at `step`.
//
// What each number covers (docs/accelerator.md, "Step time breakdown"):
//   forward_ms        from the end of the previous optimizer step (or of the
//                     previous micro-step's backward; for the first step,
//                     the last zero_grad() or prepare) to the start of
//                     Accelerator::backward(): the forward pass, the loss
//                     and the data loading. A LibTorch module's forward()
//                     is the program's own call, with no hook to time it
//                     alone.
//   backward_ms       inside Accelerator::backward() (with DDP's bucket
//                     reductions that overlap it and its end-of-backward
//                     wait).
//   step_ms           inside the prepared optimizer's synchronising step():
//                     unscaling, clipping done there, the update and ZeRO's
//                     parameter all-gather.
//   communication_ms  the time this rank spent blocked on gradient and
//                     parameter communication during the step, mostly part
//                     of the three above (DDP: launching its bucket
//                     reductions and waiting for them at the end of
//                     backward; ZeRO: waits for gathers, reductions and the
//                     update's all-gather).
// With gradient accumulation a step's forward and backward sum its
// micro-steps. With several optimizers, the steps of one Accelerator step
// (Accelerator::step()) add up; a step skipped for an overflow adds its
// time to the window without counting as a step.
//
// A plain value.

#include <cstdint>

namespace tandem {

struct WallClockBreakdown {
  // Accelerator::step() when the window closed; 0 while none has closed
  // (and always when the breakdown is off).
  int64_t step = 0;
  // Optimizer steps the averages are over (steps_per_print, fewer for the
  // first window after load_state()).
  int64_t steps = 0;
  double forward_ms = 0;
  double backward_ms = 0;
  double step_ms = 0;
  double communication_ms = 0;
};

}  // namespace tandem
