#pragma once
// ZeRO stages 2 and 3's gradient reduction: a complete group's gradients are
// packed into one fp32 buffer (the wire) and freed, so no full gradient
// outlives its group; on the communication thread the wire is
// reduce-scattered into this rank's fp32 gradient shard (with reduce_scatter
// off, all-reduced and sliced; under HSDP the shard is then all-reduced
// across the replicate group). Micro-steps accumulate in the shard until
// zero_grad(); gradient sync is not consulted, every backward is reduced.
//
// In stage 3 a unit's gathered fp32 parameters are dead once its gradients
// are in, so their memory becomes the wire, and the end of backward
// releases every unit still gathered (UnitGatherer::end_backward()).

#include <cstddef>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "zero/comm_clock.h"
#include "zero/comm_queue.h"
#include "zero/reduction_policy.h"
#include "zero/unit_gatherer.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class ShardedReduceScatter final : public ReductionPolicy {
 public:
  // See ReductionPolicy for the contract and thread-safety. `replicate`
  // (HSDP; null: none): each shard is all-reduced across it after the
  // reduce-scatter over `pg`. `reduce_scatter`: ZeroOptions::reduce_scatter.
  ShardedReduceScatter(const ZeroLayout& layout, UnitGatherer& gatherer, ProcessGroup& pg,
                       ProcessGroup* replicate, CommQueue& queue, CommClock& clock,
                       bool reduce_scatter);

  bool reduces_backward(bool /*gradient_sync*/) const override { return true; }
  void gradient_ready(std::size_t /*index*/) override {}
  // Packs the group's gradients into its wire and drops them (a stage-3
  // unit's gathered parameters are taken or released here).
  void group_complete(std::size_t group) override;
  // Adds the gradient into the group's packed wire and drops it.
  void add_late_gradient(std::size_t index) override;
  // Hands the group's wire to a queued reduce-scatter.
  void launch(std::size_t group) override;
  // Releases the stage-3 units (a no-op for the gatherer otherwise).
  void end_backward() override;
  // Zeroes the gradient shards and drops the parameters' gradients.
  void zero_grad() override;

 private:
  const ZeroLayout& layout_;
  UnitGatherer& gatherer_;
  ProcessGroup& pg_;
  ProcessGroup* replicate_;
  CommQueue& queue_;
  CommClock& clock_;
  const bool reduce_scatter_;
  std::vector<at::Tensor> wire_;  // per group: the packed fp32 gradients to launch
};

}  // namespace tandem::detail
