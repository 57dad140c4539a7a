#pragma once
// ZeRO's backward: hooks count each group's gradients in, and complete
// groups are reduced strictly in group order, so every rank issues the same
// collectives in the same sequence (with overlap_comm, as they complete
// during backward; without it, once backward ends). How a group is reduced
// is the ReductionPolicy's, chosen once from the layout's ShardingPlan:
// FlatAllReduce (stage 1, DDP's in-place all-reduce of the flat gradient
// buffer) or ShardedReduceScatter (stages 2 and 3, pack and reduce-scatter
// into this rank's gradient shard, then all-reduce it across the replicas
// under HSDP).
//
// Owns the gradient hooks, the readiness of the backward in progress, the
// no-sync flag and the policy (with whatever the policy keeps, such as the
// packs waiting for their turn to launch).
//
// Thread-safety: the gradient hooks and the end-of-backward callback (any
// autograd thread) and the training thread's calls serialize on mutex_; the
// policy runs only under it. Lock order: mutex_, then the UnitGatherer's
// (packing a stage-3 unit's gradients frees its parameters), then the
// CommClock's. Neither of those calls back into the reducer.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/torch_internals.h"
#include "parallel/grad_readiness.h"
#include "tandem/comm/process_group.h"
#include "zero/comm_clock.h"
#include "zero/comm_queue.h"
#include "zero/reduction_policy.h"
#include "zero/unit_gatherer.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class GradientReducer {
 public:
  // Installs a hook on every parameter's gradient accumulator; they go with
  // the reducer.
  // `replicate` (HSDP; null: none): each gradient shard is all-reduced
  // across it after its reduce-scatter over `pg`.
  GradientReducer(const ZeroLayout& layout, UnitGatherer& gatherer, ProcessGroup& pg,
                  ProcessGroup* replicate, CommQueue& queue, CommClock& clock,
                  const ZeroOptions& options);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Whether a backward is running (its gradients are being reduced).
  bool in_backward() const;
  // Off: the flat all-reduce (stage 1) accumulates gradients locally, as
  // DDP's no_sync; the sharded reduction (stages 2 and 3) reduces every
  // backward. Between backwards.
  void set_gradient_sync(bool enabled);
  bool gradient_sync() const { return sync_enabled_; }
  // Waits for reductions in flight, zeroes the gradient buffers and shards,
  // and (stages 2 and 3) drops the parameters' gradients.
  void zero_grad();

 private:
  void on_grad_ready(std::size_t index);
  // A firing of parameter `index` after its gradient counted as complete
  // this backward (see arrivals_).
  void on_late_gradient(std::size_t index);
  void finalize_backward();
  [[noreturn]] void throw_late_gradients() const;
  void launch_ready_groups();

  const ZeroLayout& layout_;
  CommQueue& queue_;
  CommClock& clock_;
  const bool overlap_comm_;  // ZeroOptions::overlap_comm
  // Declared before the hooks, so that it outlives them.
  const std::unique_ptr<ReductionPolicy> policy_;
  std::vector<internals::GradHook> grad_hooks_;  // removed when the reducer goes

  mutable std::mutex mutex_;
  bool sync_enabled_ = true;
  GradReadiness readiness_;  // which gradients of this backward arrived
  // A parameter a checkpointed block uses gets one gradient per pass of the
  // block (a block run twice per forward, a weight tied across blocks): its
  // hook fires that many times in one backward. The first backward after
  // checkpointed blocks ran counts the firings (`counting_`) and launches
  // its groups only at its end, adding a firing that comes after its group
  // was packed into the pack; every later backward takes a parameter's
  // gradient as complete at that count (`expected_`). One that fires again
  // after its group was launched is an error (`late_`), never a silent loss.
  std::vector<int> arrivals_;  // this backward, per parameter
  std::vector<int> expected_;  // per parameter, 1 until counted
  std::vector<bool> packed_;   // per group, this backward: group_complete() ran
  std::vector<std::size_t> late_;
  bool counting_ = false;
  bool counted_ = false;
  std::uint64_t checkpointed_seen_ = 0;  // checkpointed_forwards() at the last count
};

}  // namespace tandem::detail
