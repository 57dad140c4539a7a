#include "zero/comm_queue.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "tandem/core/logging.h"

namespace tandem::detail {

struct CommQueue::Worker {
  // The helper's errors carry the rank of the thread that made the queue (one
  // rank of a ranks-as-threads test; a real process has a process-wide label).
  Worker()
      : thread([this, label = thread_rank_label()] {
          if (label.first >= 0) set_thread_rank_label(label.first, label.second);
          run();
        }) {}

  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    thread.join();
  }

  void wait_idle(std::unique_lock<std::mutex>& lock) {
    idle.wait(lock, [this] { return tasks.empty() && !busy; });
  }

  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [this] { return stopping || !tasks.empty(); });
        if (tasks.empty()) return;
        task = std::move(tasks.front());
        tasks.pop_front();
        busy = true;
      }
      task();  // a packaged_task stores its exception in the future
      {
        std::lock_guard<std::mutex> lock(mutex);
        busy = false;
      }
      idle.notify_all();
    }
  }

  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;
  std::deque<std::packaged_task<void()>> tasks;
  std::exception_ptr first_error;
  bool busy = false;
  bool stopping = false;
  std::thread thread;  // last: starts once the fields above exist
};

namespace {

// The live worker of each process group. A group outlives its queues (every
// ZeRO engine holds its group), so an address is never reused while a
// worker for it lives.
std::mutex registry_mutex;
std::map<const void*, std::weak_ptr<CommQueue::Worker>>& registry() {
  static std::map<const void*, std::weak_ptr<CommQueue::Worker>> workers;
  return workers;
}

}  // namespace

CommQueue::CommQueue(const void* group) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& workers = registry();
  worker_ = workers[group].lock();
  if (worker_ == nullptr) {
    worker_ = std::make_shared<Worker>();
    workers[group] = worker_;
  }
  for (auto it = workers.begin(); it != workers.end();) {
    it = it->second.expired() ? workers.erase(it) : std::next(it);
  }
}

CommQueue::~CommQueue() {
  std::unique_lock<std::mutex> lock(worker_->mutex);
  worker_->wait_idle(lock);
}

std::shared_future<void> CommQueue::submit(std::function<void()> task) {
  // The wrapper records the first failure for drain(), and still lets the
  // future carry it to whoever waits on this task.
  Worker* worker = worker_.get();
  std::packaged_task<void()> packaged([worker, task = std::move(task)] {
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> lock(worker->mutex);
      if (!worker->first_error) worker->first_error = std::current_exception();
      throw;
    }
  });
  std::shared_future<void> future = packaged.get_future().share();
  {
    std::lock_guard<std::mutex> lock(worker->mutex);
    worker->tasks.push_back(std::move(packaged));
  }
  worker->wake.notify_one();
  return future;
}

void CommQueue::drain() {
  std::unique_lock<std::mutex> lock(worker_->mutex);
  worker_->wait_idle(lock);
  if (worker_->first_error) {
    std::exception_ptr error = worker_->first_error;
    worker_->first_error = nullptr;
    std::rethrow_exception(error);
  }
}

}  // namespace tandem::detail
