#pragma once
// BatchWorkers: N threads that assemble the batches of a range ahead of the
// consumer, out of order, handed back strictly in order. Private to the data
// layer; DistributedLoader owns one per pass when it has workers (or the
// one-thread `prefetch`).
//
// Why claims are in order and bounded by the consumer's position (not a
// per-worker queue): the batch a worker assembles next is always the lowest
// one not yet claimed, so the batch the consumer waits for is never stuck
// behind later ones, and at most `max_in_flight` batches exist at a time
// whatever the workers' speeds.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>

namespace tandem::detail {

class BatchWorkers {
 public:
  using Batch = std::vector<at::Tensor>;
  // Assembles batch number b. Runs on the worker threads, concurrently for
  // different b; each b at most once.
  using Produce = std::function<Batch(int64_t b)>;

  // What pop() hands back: the batch, or the exception its Produce threw
  // and the worker that ran it.
  struct Result {
    Batch batch;
    std::exception_ptr error;
    int64_t worker = 0;
  };

  // Starts `num_threads` (>= 1) threads at once on batches [first, last),
  // with at most `max_in_flight` (>= 1) batches claimed and not yet popped.
  // The threads run with the caller's thread-local state (grad mode,
  // inference mode, ...), so a batch comes out as it would synchronously.
  BatchWorkers(Produce produce, int64_t first, int64_t last, int64_t num_threads,
               int64_t max_in_flight);

  // Stops claiming, waits for the batches being assembled and joins every
  // thread; drops finished ones. Never throws, never waits on the consumer.
  ~BatchWorkers();

  BatchWorkers(const BatchWorkers&) = delete;
  BatchWorkers& operator=(const BatchWorkers&) = delete;

  // The next batch in order, blocking until it is ready. After a Result
  // with an error no later batch is claimed: the caller ends the pass. Call
  // at most last - first times, from one thread.
  Result pop();

 private:
  void run(int64_t worker);

  Produce produce_;
  int64_t last_;
  int64_t max_in_flight_;
  at::ThreadLocalState caller_state_;
  std::mutex mutex_;
  std::condition_variable changed_;  // a batch finished, was popped, or stop_/failed_ was set
  std::map<int64_t, Result> finished_;
  int64_t next_claim_;
  int64_t next_pop_;
  bool stop_ = false;
  bool failed_ = false;
  // Last member: the threads start once everything they touch exists.
  std::vector<std::thread> threads_;
};

}  // namespace tandem::detail
