// Accelerator::check_trigger: a flag raised on any rank, seen on all.

#include <ATen/ATen.h>

#include "accelerate/accelerator_impl.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {

bool Accelerator::check_trigger() {
  // One int32 MAX: 1 when any rank raised its flag.
  at::Tensor flag = at::full({1}, impl_->trigger ? 1 : 0, at::kInt);
  impl_->group->all_reduce(flag, ReduceOp::kMax);
  if (flag.item<int>() == 0) return false;
  // Fired on every rank: each clears its flag, so the next check starts clean.
  impl_->trigger = false;
  return true;
}

}  // namespace tandem
