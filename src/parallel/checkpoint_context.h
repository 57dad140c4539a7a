#pragma once
// What activation checkpointing carries from a block's forward to its
// recompute: the random generators' states and the autocast state, each with
// a scope that puts it in place and restores what was there. Private to
// src/parallel.

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace tandem::detail {

// How many checkpointed blocks ran forward with grad mode on, in this
// process, so far. Each one's backward is a pass of its own, so a parameter
// it uses may get its gradient more than once in one backward; ZeRO's
// reducer counts them when this moved (zero/gradient_reducer.h).
std::uint64_t checkpointed_forwards();
// Counts one (checkpoint_tensors with grad mode on).
void count_checkpointed_forward();

// The default CPU generator's state and that of the given CUDA devices.
struct RngSnapshot {
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> cuda;

  // `devices`: the CUDA devices to include (those the block's inputs are on).
  static RngSnapshot take(const std::vector<c10::Device>& devices);
  void restore() const;
};

// Runs with `forward`'s generator states, then puts back the states it found.
class RngScope {
 public:
  explicit RngScope(const RngSnapshot& forward);
  ~RngScope();
  RngScope(const RngScope&) = delete;
  RngScope& operator=(const RngScope&) = delete;

 private:
  RngSnapshot previous_;
};

// The calling thread's autocast flags and dtypes for CPU and CUDA, and whether
// autocast caches its casts.
struct AutocastSnapshot {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
  bool cache_enabled = true;

  static AutocastSnapshot take();
  void apply() const;
};

// Enters `state` as one autocast nesting level (as torch.autocast does:
// the cache is cleared when the outermost level exits) and restores the
// previous state on exit.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastSnapshot& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastSnapshot previous_;
};

// Turns autocast's cast cache off for the scope. The checkpoint's first
// forward runs without grad; a cast cached there would have no graph, and a
// later use of the same weight in the same autocast region would take it and
// leave the weight without its gradient.
class AutocastCacheOff {
 public:
  AutocastCacheOff();
  ~AutocastCacheOff();
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool previous_;
};

// Sets recomputing_checkpoint() for the scope, and restores it after.
class RecomputeFlag {
 public:
  explicit RecomputeFlag(bool recomputing);
  ~RecomputeFlag();
  RecomputeFlag(const RecomputeFlag&) = delete;
  RecomputeFlag& operator=(const RecomputeFlag&) = delete;

 private:
  bool previous_;
};

// Collects the queue_end_of_backward() calls made on this thread during a
// nested backward, and hands them to the enclosing pass when destroyed.
class NestedBackwardScope {
 public:
  NestedBackwardScope();
  ~NestedBackwardScope();
  NestedBackwardScope(const NestedBackwardScope&) = delete;
  NestedBackwardScope& operator=(const NestedBackwardScope&) = delete;

 private:
  std::vector<std::function<void()>> deferred_;
};

}  // namespace tandem::detail
