#pragma once
// Work: a handle on an asynchronous collective.

#include <chrono>
#include <functional>
#include <future>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Work;
}

namespace tandem {

// Move-only. wait() must be called exactly once before the tensors involved
// are reused; destroying an unwaited Work waits for it first, so no
// collective is ever left running on freed memory.
class Work {
 public:
  Work();  // an already-completed no-op
  Work(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout,
       std::string description, std::function<void()> on_complete);
  // A collective run by tandem's own transport; the future carries its error.
  Work(std::shared_future<void> future, std::string description);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // True once the collective has finished (without waiting).
  bool is_completed() const;

  // Blocks until done or the timeout passes. Throws TimeoutError or
  // CommError naming the collective. Runs the completion step (e.g. the
  // division of an average) on the calling thread.
  void wait();

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_future<void> future_;
  std::chrono::milliseconds timeout_{0};
  std::string description_;
  std::function<void()> on_complete_;
  bool waited_ = true;
};

}  // namespace tandem
