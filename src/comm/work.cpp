#include "tandem/comm/work.h"

#include "comm/comm_error.h"
#include "core/torch_compat.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {

namespace detail {

void rethrow_as_comm_error(const std::string& what, std::chrono::milliseconds timeout) {
  std::string reason;
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    reason = e.what();
  }
  // Keep only the first line: c10 appends a long C++ backtrace.
  auto newline = reason.find('\n');
  if (newline != std::string::npos) reason.resize(newline);
  bool timed_out = reason.find("imed out") != std::string::npos ||
                   reason.find("imeout") != std::string::npos;
  if (timed_out) {
    TANDEM_THROW(TimeoutError,
                 "{} did not complete within {} ms: {}. A rank is missing, slow or stuck; check "
                 "the other ranks' logs, or raise the timeout",
                 what, timeout.count(), reason);
  }
  TANDEM_THROW(CommError,
               "{} failed: {}. Another rank probably exited or crashed; its log names the cause",
               what, reason);
}

}  // namespace detail

Work::Work(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout,
           std::string description, std::function<void()> on_complete)
    : work_(std::move(work)),
      timeout_(timeout),
      description_(std::move(description)),
      on_complete_(std::move(on_complete)),
      waited_(false) {}

Work::Work() = default;

Work::Work(std::shared_future<void> future, std::string description)
    : future_(std::move(future)), description_(std::move(description)), waited_(false) {}

Work::Work(Work&& other) noexcept { *this = std::move(other); }

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    work_ = std::move(other.work_);
    future_ = std::move(other.future_);
    timeout_ = other.timeout_;
    description_ = std::move(other.description_);
    on_complete_ = std::move(other.on_complete_);
    waited_ = other.waited_;
    other.waited_ = true;
  }
  return *this;
}

Work::~Work() {
  if (waited_ || (!work_ && !future_.valid())) return;
  try {
    if (future_.valid()) {
      future_.get();
      return;
    }
    work_->wait(timeout_);
  } catch (const std::exception& e) {
    log_error("{} failed while its handle was dropped unwaited: {}", description_, e.what());
  }
}

bool Work::is_completed() const {
  if (waited_) return true;
  if (future_.valid()) return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  return !work_ || work_->isCompleted();
}

void Work::wait() {
  if (waited_) return;
  waited_ = true;
  if (future_.valid()) future_.get();  // the transport bounds its own waits
  if (work_) {
    try {
      work_->wait(timeout_);
    } catch (...) {
      detail::rethrow_as_comm_error(description_, timeout_);
    }
  }
  if (on_complete_) on_complete_();
}

}  // namespace tandem
