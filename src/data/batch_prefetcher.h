#pragma once
// BatchPrefetcher: one background thread that prepares the batches of a
// range ahead of the consumer, up to a fixed number at a time. Private to
// the data layer; DistributedLoader owns one per pass when prefetch > 0.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>

namespace tandem::detail {

class BatchPrefetcher {
 public:
  using Batch = std::vector<at::Tensor>;
  // Prepares batch number b; runs on the background thread, never twice at
  // once, in increasing b.
  using Produce = std::function<Batch(int64_t b)>;

  // Starts the thread at once on batches [first, last), keeping at most
  // `capacity` (>= 1) finished batches waiting. The thread runs with the
  // caller's thread-local state (grad mode, inference mode, ...), so a
  // batch comes out as it would have synchronously.
  BatchPrefetcher(Produce produce, int64_t first, int64_t last, int64_t capacity);

  // Stops the thread and joins it: waits for a batch being prepared, drops
  // the ones waiting. Never throws.
  ~BatchPrefetcher();

  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The next batch in order, blocking until it is ready. Rethrows, on the
  // consumer's thread, an exception the producer threw for that batch; the
  // thread stops after one. Call at most last - first times, from one thread.
  Batch pop();

 private:
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  void run(int64_t first, int64_t last);

  Produce produce_;
  int64_t capacity_;
  at::ThreadLocalState caller_state_;
  std::mutex mutex_;
  std::condition_variable ready_;  // a slot was pushed
  std::condition_variable space_;  // a slot was popped, or stop_ was set
  std::deque<Slot> slots_;
  bool stop_ = false;
  // Last member: the thread starts once everything it touches exists.
  std::thread thread_;
};

}  // namespace tandem::detail
