#include "zero/comm_clock.h"

namespace tandem::detail {

void CommClock::add_since(Field field, std::chrono::steady_clock::time_point start) {
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.*field += took.count();
  if (field == &ZeroOptimizer::CommStats::gather_seconds) ++stats_.gathers;
  if (field == &ZeroOptimizer::CommStats::reduce_scatter_seconds) ++stats_.reduce_scatters;
  if (field == &ZeroOptimizer::CommStats::gather_wait_seconds ||
      field == &ZeroOptimizer::CommStats::drain_wait_seconds ||
      field == &ZeroOptimizer::CommStats::update_gather_seconds) {
    blocked_seconds_ += took.count();
  }
}

void CommClock::add_bytes(Count field, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.*field += bytes;
  if (field == &ZeroOptimizer::CommStats::replicate_bytes) ++stats_.replicate_all_reduces;
}

void CommClock::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.last_step_replicate_bytes = stats_.replicate_bytes - replicate_bytes_at_step_;
  replicate_bytes_at_step_ = stats_.replicate_bytes;
}

void CommClock::drain(CommQueue& queue) {
  const auto start = std::chrono::steady_clock::now();
  queue.drain();  // not under mutex_: the tasks it waits for add to the clock
  add_since(&ZeroOptimizer::CommStats::drain_wait_seconds, start);
}

void CommClock::count(int64_t ZeroOptimizer::CommStats::*counter) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(stats_.*counter);
}

ZeroOptimizer::CommStats CommClock::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

double CommClock::blocked_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocked_seconds_;
}

void CommClock::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = ZeroOptimizer::CommStats();
  replicate_bytes_at_step_ = 0;
}

}  // namespace tandem::detail
