#pragma once
// One helper thread that runs a ZeRO optimizer's collectives in the order
// they were queued. Gathers and reduce-scatters then overlap the training
// thread's compute, and every rank still issues its collectives in one
// deterministic sequence (the training thread queues them in program order).

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace tandem::detail {

class CommQueue {
 public:
  CommQueue();
  // Waits for queued work, then stops the thread. Errors of unwaited tasks
  // are dropped (the training thread has already failed or moved on).
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // Queues `task`; the future carries its exception, if any.
  std::shared_future<void> submit(std::function<void()> task);
  // Blocks until every queued task has run; rethrows the first error among
  // them not yet seen through a future.
  void drain();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::packaged_task<void()>> tasks_;
  std::exception_ptr first_error_;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::detail
