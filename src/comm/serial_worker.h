#pragma once
// SerialWorker: one thread that runs submitted jobs one at a time, in the
// order they were submitted. The shared-memory transport, the hierarchical
// collectives and each shared-memory channel end use one, so their async
// calls return at once and every rank runs its queue in the same order.
//
// The thread takes the rank label of the thread that built the worker, so
// its errors name the rank as the caller's would (the global rank, also on a
// subgroup). The destructor runs every job still queued, then joins: declare
// the worker last, so that it stops before the state its jobs use goes.
// Thread-safe.

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace tandem::detail {

class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `body`; the future completes when it has run, holding what it
  // threw, if anything.
  std::shared_future<void> submit(std::function<void()> body);

 private:
  void loop(std::pair<int, int> label);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace tandem::detail
