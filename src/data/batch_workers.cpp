#include "data/batch_workers.h"
#include "data/worker_threads.h"

#include <utility>

namespace tandem::detail {

BatchWorkers::BatchWorkers(Produce produce, int64_t first, int64_t last, int64_t num_threads,
                           int64_t max_in_flight)
    : produce_(std::move(produce)),
      last_(last),
      max_in_flight_(max_in_flight),
      next_claim_(first),
      next_pop_(first) {
  threads_.reserve(static_cast<size_t>(num_threads));
  try {
    for (int64_t w = 0; w < num_threads; ++w) threads_.emplace_back([this, w] { run(w); });
  } catch (...) {
    // A thread could not start (resource limits): stop the ones that did.
    stop_and_join(mutex_, stop_, changed_, threads_);
    throw;
  }
}

BatchWorkers::~BatchWorkers() {
  stop_and_join(mutex_, stop_, changed_, threads_);
}

BatchWorkers::Result BatchWorkers::pop() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return finished_.count(next_pop_) != 0; });
  auto node = finished_.extract(next_pop_);
  ++next_pop_;
  lock.unlock();
  // A worker may be waiting for the in-flight window to move.
  changed_.notify_all();
  return std::move(node.mapped());
}

void BatchWorkers::run(int64_t worker) {
  at::ThreadLocalStateGuard state_guard(caller_state_);
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] {
      return stop_ || failed_ || next_claim_ >= last_ ||
             next_claim_ - next_pop_ < max_in_flight_;
    });
    if (stop_ || failed_ || next_claim_ >= last_) return;
    const int64_t b = next_claim_++;
    lock.unlock();
    // Assemble outside the lock: other workers claim and the consumer pops
    // meanwhile.
    Result result;
    result.worker = worker;
    try {
      result.batch = produce_(b);
    } catch (...) {
      result.error = std::current_exception();
    }
    lock.lock();
    // Batches after a failed one would never be asked for.
    if (result.error) failed_ = true;
    finished_.emplace(b, std::move(result));
    changed_.notify_all();
  }
}

}  // namespace tandem::detail
