#pragma once
// Stage 3's gathers: each Sharded unit's parameters are whole only around
// its forward and its backward, gathered on the communication thread with
// the next units' gathers queued ahead (prefetch) in the forward order of
// the first pass.
//
// Owns the hooks on the units, each unit's gather state, the forward order,
// the GatheredParameters hold and the gathered-bytes accounting. Groups that
// are no unit (all of them in stages 1 and 2) stay whole, and every call
// leaves them alone.
//
// Thread-safety: the unit hooks (the training thread in forward, autograd
// threads in backward and in a checkpoint's recomputation), the
// GradientReducer and the training thread's calls serialize on mutex_.
// Under it the gatherer calls only the CommQueue and the CommClock, never the
// reducer, so the reducer may call in while holding its own lock.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/zero/zero_optimizer.h"
#include "zero/bucketed_gather.h"
#include "zero/comm_clock.h"
#include "zero/comm_queue.h"
#include "zero/sharded_hooks.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class UnitGatherer {
 public:
  // Attaches hooks to the layout's units; every unit starts released.
  UnitGatherer(const ZeroLayout& layout, ProcessGroup& pg, CommQueue& queue, CommClock& clock,
               const ZeroOptions& options);
  // Detaches the hooks, so the units run as plain modules again.
  ~UnitGatherer();
  UnitGatherer(const UnitGatherer&) = delete;
  UnitGatherer& operator=(const UnitGatherer&) = delete;

  // GatheredParameters: every unit whole until release_all(), which keeps
  // what the caller changed in them (each rank its own). Do nothing unless
  // the plan partitions parameters (stage 3).
  void gather_all();
  void release_all();
  // GatheredParameters over some units: `groups` whole until release_held(),
  // which keeps what rank `modifier_rank` holds in them (broadcast to every
  // rank first), or with none discards every change. The groups outside
  // the units (always whole) are treated alike.
  // Guards nest: each release ends the innermost open one, and a group
  // stays whole until no open guard holds it.
  void gather_groups(const std::vector<std::size_t>& groups);
  void release_held(std::optional<int> modifier_rank);
  bool holding() const;

  // Fixes the forward order prefetch follows, once a pass has recorded one
  // (at the end of a backward or at a step).
  void settle_forward_order();
  // End of a backward: releases every unit (unless held) and settles the
  // order. Does nothing unless the plan partitions parameters (stage 3).
  void end_backward();

  // For the reducer packing group `group`'s gradients: if the unit's fp32
  // parameters are gathered on the device, their memory, now the caller's
  // (the unit counts as released); otherwise an undefined tensor.
  at::Tensor take_whole(std::size_t group);
  // Frees a unit's gathered parameters (waiting for a gather in flight).
  void release(std::size_t group);

  // Fills `full` from every rank's `shard` (a copy, not a view of `full`)
  // by all-gather, in calls of at most ZeroOptions::allgather_bucket_size
  // elements, counted (and timed: update_gather_seconds) in the CommClock.
  // Collective; on the calling thread.
  void all_gather_whole(at::Tensor& full, const at::Tensor& shard);

  // Calls fn(name, parameter) for every parameter, each unit gathered for
  // the call and released again if it was. Between backwards.
  void for_each_whole_parameter(
      const std::function<void(const std::string&, const at::Tensor&)>& fn);

  // Bytes of unit parameters gathered now, and at most since reset_peak().
  int64_t live_bytes() const;
  int64_t peak_live_bytes() const;
  void reset_peak();

  // The unit hooks (ShardedUnitHooks) of group `group`.
  void before_forward(std::size_t group);
  at::Tensor after_forward(std::size_t group, at::Tensor output);
  void before_backward(std::size_t group);

 private:
  enum class State { kWhole, kGathering, kReleased };
  struct Unit {
    State state = State::kWhole;
    std::shared_future<void> gathered;  // while kGathering
  };

  // Under mutex_.
  void gather(std::size_t group, bool wait);
  // Starts gathers of the units after `group` in forward order (direction
  // +1) or before it (-1), within prefetch_bucket_size and
  // max_live_parameters.
  void prefetch_from(std::size_t group, int direction);
  void release_locked(std::size_t group);
  void write_back_shard(std::size_t group);
  // One GatheredParameters guard: its groups, and whether it is the
  // whole-model form.
  struct Hold {
    std::vector<std::size_t> groups;
    bool every = false;
  };
  void hold(std::vector<std::size_t> groups, bool every);
  void release_hold(std::optional<int> modifier_rank);
  // Whether the units of group `group` stay whole (GatheredParameters).
  bool held(std::size_t group) const { return held_count_[group] > 0; }

  const ZeroLayout& layout_;
  ProcessGroup& pg_;
  CommQueue& queue_;
  CommClock& clock_;
  const ZeroOptions& options_;
  std::vector<std::unique_ptr<ShardedUnitHooks>> hooks_;

  mutable std::mutex mutex_;
  std::vector<Unit> units_;  // per group of the layout
  std::vector<std::size_t> forward_order_;
  bool forward_order_fixed_ = false;
  std::vector<Hold> holds_;       // open guards, innermost last
  std::vector<int> held_count_;   // per group: the open guards holding it
  std::vector<at::Tensor> kept_;  // per group outside the units: values to put back
  int64_t live_bytes_ = 0;
  int64_t peak_live_bytes_ = 0;
};

}  // namespace tandem::detail
