#pragma once
// Work: a handle on an asynchronous collective.

#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Work;
}

namespace tandem {

// Move-only. wait() must be called exactly once before the tensors involved
// are reused; destroying an unwaited Work waits for it first (at most the
// timeout, then it logs the error), so no collective is ever left running on
// freed memory and no destructor hangs.
class Work {
 public:
  Work();  // an already-completed no-op
  // `explain_timeout`, when given, is asked on a timeout which ranks did not
  // arrive; its answer goes into the TimeoutError.
  Work(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout,
       std::string description, std::function<void()> on_complete,
       std::function<std::string()> explain_timeout = nullptr);
  // Several c10d operations that finish together (a send's header and
  // data), waited for in order within one timeout.
  Work(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::chrono::milliseconds timeout,
       std::string description, std::function<std::string()> explain_timeout = nullptr);
  // A collective run by tandem's own transport; the future carries its error
  // (the transport bounds its own waits by `timeout`).
  Work(std::shared_future<void> future, std::string description,
       std::chrono::milliseconds timeout = {},
       std::function<std::string()> explain_timeout = nullptr);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // True once the collective has finished (without waiting).
  bool is_completed() const;

  // Blocks until done or the timeout passes. Throws TimeoutError (naming the
  // collective, its sequence number and the ranks that did not arrive) or
  // CommError. Runs the completion step (e.g. the division of an average) on
  // the calling thread.
  void wait();

 private:
  void wait_backend();

  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::shared_future<void> future_;
  std::chrono::milliseconds timeout_{0};
  std::string description_;
  std::function<void()> on_complete_;
  std::function<std::string()> explain_timeout_;
  bool waited_ = true;
};

}  // namespace tandem
