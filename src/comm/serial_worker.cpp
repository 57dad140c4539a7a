#include "comm/serial_worker.h"

#include <utility>

#include "tandem/core/logging.h"

namespace tandem::detail {

SerialWorker::SerialWorker()
    : thread_([this, label = thread_rank_label()] { loop(label); }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SerialWorker::loop(std::pair<int, int> label) {
  if (label.first >= 0) set_thread_rank_label(label.first, label.second);
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

std::shared_future<void> SerialWorker::submit(std::function<void()> body) {
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back([body = std::move(body), done] {
      try {
        body();
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
  }
  cv_.notify_one();
  return future;
}

}  // namespace tandem::detail
