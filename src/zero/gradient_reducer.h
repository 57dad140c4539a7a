#pragma once
// ZeRO's backward: as each group's gradients complete, stage 1 all-reduces
// the flat gradient buffer they are views of (DDP's scheme), and stages 2
// and 3 pack them into one fp32 buffer, free them, and reduce-scatter the
// pack into this rank's fp32 gradient shard on the communication thread
// while backward goes on (with overlap_comm off, once backward ends; with
// reduce_scatter off, by all-reduce; under HSDP, then all-reduce that shard
// across the replicate group). Micro-steps accumulate there until
// zero_grad().
//
// Owns the gradient hooks, the readiness of the backward in progress, the
// packs waiting for their turn to launch, and the no-sync flag.
//
// Thread-safety: the gradient hooks and the end-of-backward callback (any
// autograd thread) and the training thread's calls serialize on mutex_.
// Lock order: mutex_, then the UnitGatherer's (packing a stage-3 unit's
// gradients frees its parameters), then the CommClock's. Neither of those
// calls back into the reducer.

#include <cstddef>
#include <mutex>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/torch_internals.h"
#include "parallel/grad_readiness.h"
#include "tandem/comm/process_group.h"
#include "zero/comm_clock.h"
#include "zero/comm_queue.h"
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
  // Off: stage 1 accumulates gradients locally, as DDP's no_sync (stages 2
  // and 3 reduce every backward). Between backwards.
  void set_gradient_sync(bool enabled);
  bool gradient_sync() const { return sync_enabled_; }
  // Waits for reductions in flight, zeroes the gradient buffers and shards,
  // and (stages 2 and 3) drops the parameters' gradients.
  void zero_grad();

 private:
  void on_grad_ready(std::size_t index);
  void finalize_backward();
  void adopt_grad(std::size_t index);
  void prepare(std::size_t group);
  void launch_ready_groups();
  void launch(std::size_t group);

  const ZeroLayout& layout_;
  UnitGatherer& gatherer_;
  ProcessGroup& pg_;
  ProcessGroup* replicate_;
  CommQueue& queue_;
  CommClock& clock_;
  const int stage_;
  const bool reduce_scatter_;  // ZeroOptions::reduce_scatter
  const bool overlap_comm_;    // ZeroOptions::overlap_comm
  std::vector<internals::GradHook> grad_hooks_;  // removed when the reducer goes

  mutable std::mutex mutex_;
  bool sync_enabled_ = true;
  GradReadiness readiness_;  // which gradients of this backward arrived
  std::vector<at::Tensor> wire_;  // per group: the packed fp32 gradients to launch
};

}  // namespace tandem::detail
