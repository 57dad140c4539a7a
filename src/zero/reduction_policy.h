#pragma once
// How ZeRO reduces a group's gradients once the GradientReducer's shared
// readiness machinery (parallel/grad_readiness.h) finds the group complete.
// Two policies, chosen once from the ShardingPlan when the reducer is built:
//   FlatAllReduce         stage 1: gradients are views of a flat buffer per
//                         group, all-reduced in place (DDP's scheme)
//   ShardedReduceScatter  stages 2 and 3: gradients packed, freed and
//                         reduce-scattered into this rank's shard (then,
//                         under HSDP, all-reduced across the replicas)
// The reducer keeps the hooks, the readiness, the group order and the
// no-sync flag; a policy keeps only what its own scheme needs.
//
// Thread-safety: not thread-safe. The reducer calls every method under its
// own mutex, and a policy may call the UnitGatherer and the CommClock from
// there (the reducer's documented lock order); it never calls the reducer.
// The tasks a policy queues hold the layout's groups, the process groups and
// the clock, never the policy, which may be gone before they run.

#include <cstddef>
#include <memory>

#include "tandem/comm/process_group.h"
#include "tandem/zero/zero_optimizer.h"
#include "zero/comm_clock.h"
#include "zero/comm_queue.h"
#include "zero/unit_gatherer.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class ReductionPolicy {
 public:
  virtual ~ReductionPolicy() = default;

  // Whether a backward run with gradient sync `gradient_sync` is reduced at
  // all; when not, its gradients accumulate in .grad (DDP's no_sync).
  virtual bool reduces_backward(bool gradient_sync) const = 0;
  // Parameter `index`'s gradient is in, or (at the end of backward) never
  // came and counts as zero. Before its group is complete.
  virtual void gradient_ready(std::size_t index) = 0;
  // Every gradient of group `group` is in: make it ready to launch.
  virtual void group_complete(std::size_t group) = 0;
  // Parameter `index` got another gradient after gradient_ready() (a
  // checkpointed block's second pass): add it to what its group sends.
  // Its group is not launched yet.
  virtual void add_late_gradient(std::size_t index) = 0;
  // Queues group `group`'s reduction; the reducer calls it in group order
  // on every rank, after group_complete(group).
  virtual void launch(std::size_t group) = 0;
  // The backward's reductions have all run (the queue is drained).
  virtual void end_backward() = 0;
  // Zeroes the reduced gradients; the queue is drained, no backward runs.
  virtual void zero_grad() = 0;
};

// The policy `layout.plan()` calls for; it reads and writes `layout`'s
// gradient buffers. `replicate` (HSDP; null: none) is used by the sharded
// policy only. Everything referenced must outlive the policy.
std::unique_ptr<ReductionPolicy> make_reduction_policy(const ZeroLayout& layout,
                                                       UnitGatherer& gatherer, ProcessGroup& pg,
                                                       ProcessGroup* replicate, CommQueue& queue,
                                                       CommClock& clock,
                                                       const ZeroOptions& options);

}  // namespace tandem::detail
