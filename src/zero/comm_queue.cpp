#include "zero/comm_queue.h"

#include "tandem/core/logging.h"

namespace tandem::detail {

// The helper's errors carry the rank of the thread that made the queue (one
// rank of a ranks-as-threads test; a real process has a process-wide label).
CommQueue::CommQueue()
    : thread_([this, label = thread_rank_label()] {
        if (label.first >= 0) set_thread_rank_label(label.first, label.second);
        run();
      }) {}

CommQueue::~CommQueue() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return tasks_.empty() && !busy_; });
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_future<void> CommQueue::submit(std::function<void()> task) {
  // The wrapper records the first failure for drain(), and still lets the
  // future carry it to whoever waits on this task.
  std::packaged_task<void()> packaged([this, task = std::move(task)] {
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_error_) first_error_ = std::current_exception();
      throw;
    }
  });
  std::shared_future<void> future = packaged.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(packaged));
  }
  wake_.notify_one();
  return future;
}

void CommQueue::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return tasks_.empty() && !busy_; });
  if (first_error_) {
    std::exception_ptr error = first_error_;
    first_error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void CommQueue::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    task();  // a packaged_task stores its exception in the future
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_.notify_all();
  }
}

}  // namespace tandem::detail
