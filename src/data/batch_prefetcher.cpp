#include "data/batch_prefetcher.h"

#include <utility>

namespace tandem::detail {

BatchPrefetcher::BatchPrefetcher(Produce produce, int64_t first, int64_t last, int64_t capacity)
    : produce_(std::move(produce)),
      capacity_(capacity),
      thread_([this, first, last] { run(first, last); }) {}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_.notify_all();
  thread_.join();
}

BatchPrefetcher::Batch BatchPrefetcher::pop() {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [this] { return !slots_.empty(); });
  Slot slot = std::move(slots_.front());
  slots_.pop_front();
  lock.unlock();
  space_.notify_one();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

void BatchPrefetcher::run(int64_t first, int64_t last) {
  at::ThreadLocalStateGuard state_guard(caller_state_);
  for (int64_t b = first; b < last; ++b) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_.wait(lock,
                  [this] { return stop_ || static_cast<int64_t>(slots_.size()) < capacity_; });
      if (stop_) return;
    }
    // Produce outside the lock: the consumer keeps popping finished batches
    // while this one is being assembled.
    Slot slot;
    try {
      slot.batch = produce_(b);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = static_cast<bool>(slot.error);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slots_.push_back(std::move(slot));
    }
    ready_.notify_one();
    // The consumer sees the error at this batch's turn and ends the pass;
    // batches after it would never be asked for.
    if (failed) return;
  }
}

}  // namespace tandem::detail
