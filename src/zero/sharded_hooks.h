#pragma once
// The hooks a ZeRO stage-3 optimizer installs on a tandem::Sharded unit
// (include/tandem/zero/sharded.h); a unit only forwards to them.

#include <ATen/core/Tensor.h>

namespace tandem::detail {

class ShardedUnitHooks {
 public:
  virtual ~ShardedUnitHooks() = default;
  // Makes the unit's parameters whole (waits for a prefetch if one is in
  // flight) and prefetches the next unit's.
  virtual void before_forward() = 0;
  // Frees the gathered parameters and ties `output`'s gradient to a gather
  // before the unit's backward. Returns the tensor to hand on.
  virtual at::Tensor after_forward(at::Tensor output) = 0;
};

}  // namespace tandem::detail
