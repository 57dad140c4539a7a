#pragma once
// The seconds ZeRO's collectives take on the communication thread, and the
// seconds the training thread waits for them (ZeroOptimizer::comm_stats()).
//
// Thread-safe: the communication thread, autograd hooks and the training
// thread all add to it. Its mutex is the innermost lock of the engine:
// nothing else is called while it is held.

#include <chrono>
#include <mutex>

#include "tandem/zero/zero_optimizer.h"
#include "zero/comm_queue.h"

namespace tandem::detail {

class CommClock {
 public:
  using Field = double ZeroOptimizer::CommStats::*;

  // Adds the seconds since `start` to `field`; a gather or reduce-scatter
  // also counts one collective.
  void add_since(Field field, std::chrono::steady_clock::time_point start);
  using Count = int64_t ZeroOptimizer::CommStats::*;
  // Adds `bytes` to `field`; replicate_bytes also counts one all-reduce.
  void add_bytes(Count field, int64_t bytes);
  // An optimizer step begins: last_step_replicate_bytes takes the bytes
  // since the previous call (or the last reset).
  void end_step();
  // Drains `queue` (rethrowing its first error), adding the wait to
  // drain_wait_seconds.
  void drain(CommQueue& queue);
  // Adds one to a counter of CommStats.
  void count(int64_t ZeroOptimizer::CommStats::*counter);

  ZeroOptimizer::CommStats stats() const;
  // The training thread's waits (gather_wait, drain_wait, update_gather)
  // summed since construction; reset() leaves it alone.
  double blocked_seconds() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  ZeroOptimizer::CommStats stats_;
  int64_t replicate_bytes_at_step_ = 0;
  double blocked_seconds_ = 0;
};

}  // namespace tandem::detail
