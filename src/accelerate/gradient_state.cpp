#include "tandem/accelerate/gradient_state.h"

#include "tandem/parallel/ddp.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem {

void GradientState::begin_micro_step() {
  ++micro_step;
  ++micro_steps_since_step;
  // The last batch of a pass always synchronises, so an epoch whose length
  // is not a multiple of the accumulation steps never leaks partial sums
  // into the next epoch (Accelerate's sync_with_dataloader).
  sync_gradients = end_of_dataloader || micro_step % accumulation_steps == 0;
  if (sync_gradients) micro_step = 0;
  if (ddp != nullptr) ddp->set_gradient_sync(sync_gradients);
  if (zero != nullptr) zero->set_gradient_sync(sync_gradients);
}

}  // namespace tandem
