// The one place a ZeroOptimizer's reduction policy is chosen: from the
// ShardingPlan, once, when the GradientReducer is built.

#include "zero/reduction_policy.h"

#include "zero/flat_all_reduce.h"
#include "zero/sharded_reduce_scatter.h"

namespace tandem::detail {

std::unique_ptr<ReductionPolicy> make_reduction_policy(const ZeroLayout& layout,
                                                       UnitGatherer& gatherer, ProcessGroup& pg,
                                                       ProcessGroup* replicate, CommQueue& queue,
                                                       CommClock& clock,
                                                       const ZeroOptions& options) {
  if (!layout.plan().shard_gradients) return std::make_unique<FlatAllReduce>(layout, pg, queue);
  return std::make_unique<ShardedReduceScatter>(layout, gatherer, pg, replicate, queue, clock,
                                                options.reduce_scatter);
}

}  // namespace tandem::detail
