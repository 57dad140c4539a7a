#include "tandem/comm/work.h"

#include <algorithm>
#include <thread>

#include "comm/comm_error.h"
#include "core/torch_compat.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {

namespace detail {

std::string format_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() % 1000 == 0) return fmt::format("{} s", timeout.count() / 1000);
  return fmt::format("{} ms", timeout.count());
}

void rethrow_as_comm_error(const std::string& what, std::chrono::milliseconds timeout,
                           const std::function<std::string()>& explain_timeout) {
  std::string reason;
  bool timed_out = false;
  try {
    throw;
  } catch (const TimeoutError&) {
    // tandem's own transport already named the operation; the explanation
    // from every rank's progress says more than its local view.
    if (!explain_timeout) throw;
    timed_out = true;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    reason = e.what();
  }
  // Keep only the first line: c10 appends a long C++ backtrace.
  auto newline = reason.find('\n');
  if (newline != std::string::npos) reason.resize(newline);
  timed_out = timed_out || reason.find("imed out") != std::string::npos ||
              reason.find("imeout") != std::string::npos;
  if (timed_out && explain_timeout) {
    TANDEM_THROW(TimeoutError,
                 "{} timed out after {}: {}. Look in those ranks' logs for an exception, a "
                 "deadlock or fewer batches than the others; if they are only slow, raise the "
                 "timeout (ProcessGroupOptions::timeout or TANDEM_TIMEOUT_S){}",
                 what, format_timeout(timeout), explain_timeout(),
                 reason.empty() ? "" : " [" + reason + "]");
  }
  if (timed_out) {
    TANDEM_THROW(TimeoutError,
                 "{} did not complete within {}: {}. A rank is missing, slow or stuck; check "
                 "the other ranks' logs, or raise the timeout",
                 what, format_timeout(timeout), reason);
  }
  TANDEM_THROW(CommError,
               "{} failed: {}. Another rank probably exited or crashed; its log names the cause",
               what, reason);
}

// NCCL's own bounded wait (WorkNCCL::wait with a timeout) aborts the
// communicator when the time is up, which blocks for as long as the kernels
// ahead of the collective run, and then tears the process down from NCCL's
// watchdog thread before the caller's exception is out: the first GPU run
// (docs/gpu.md) lost tandem's message that way. So tandem waits for an NCCL
// collective itself, polling its completion against tandem's deadline, and
// only then lets NCCL order the current stream after it (no timeout: no
// abort). The NCCL group's own timeout is set longer (c10d_transport.cpp),
// so this one fires first.
bool wait_for_nccl(c10d::Work& work, std::chrono::milliseconds timeout,
                   const std::string& description) {
#if defined(TANDEM_WITH_NCCL)
  if (dynamic_cast<c10d::ProcessGroupNCCL::WorkNCCL*>(&work) == nullptr) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!work.isCompleted()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      TANDEM_THROW(TimeoutError, "{} did not complete within {}", description,
                   format_timeout(timeout));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  work.wait();  // orders the current stream after it; throws if it failed
  return true;
#else
  (void)work;
  (void)timeout;
  (void)description;
  return false;
#endif
}

}  // namespace detail

Work::Work(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds timeout,
           std::string description, std::function<void()> on_complete,
           std::function<std::string()> explain_timeout)
    : timeout_(timeout),
      description_(std::move(description)),
      on_complete_(std::move(on_complete)),
      explain_timeout_(std::move(explain_timeout)),
      waited_(false) {
  if (work) works_.push_back(std::move(work));
}

Work::Work(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::chrono::milliseconds timeout,
           std::string description, std::function<std::string()> explain_timeout)
    : works_(std::move(works)),
      timeout_(timeout),
      description_(std::move(description)),
      explain_timeout_(std::move(explain_timeout)),
      waited_(false) {}

Work::Work() = default;

Work::Work(std::shared_future<void> future, std::string description,
           std::chrono::milliseconds timeout, std::function<std::string()> explain_timeout)
    : future_(std::move(future)),
      timeout_(timeout),
      description_(std::move(description)),
      explain_timeout_(std::move(explain_timeout)),
      waited_(false) {}

Work::Work(Work&& other) noexcept { *this = std::move(other); }

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    works_ = std::move(other.works_);
    future_ = std::move(other.future_);
    timeout_ = other.timeout_;
    description_ = std::move(other.description_);
    on_complete_ = std::move(other.on_complete_);
    explain_timeout_ = std::move(other.explain_timeout_);
    waited_ = other.waited_;
    other.waited_ = true;
  }
  return *this;
}

void Work::wait_backend() {
  // One deadline for all of them: they finish together.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (auto& work : works_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    left = std::max(left, std::chrono::milliseconds(1));
    if (!detail::wait_for_nccl(*work, left, description_)) work->wait(left);
  }
}

Work::~Work() {
  if (waited_ || (works_.empty() && !future_.valid())) return;
  try {
    if (future_.valid()) {
      future_.get();
      return;
    }
    wait_backend();
  } catch (const std::exception& e) {
    log_error("{} failed while its handle was dropped unwaited: {}", description_, e.what());
  }
}

bool Work::is_completed() const {
  if (waited_) return true;
  if (future_.valid()) return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  for (const auto& work : works_) {
    if (!work->isCompleted()) return false;
  }
  return true;
}

void Work::wait() {
  if (waited_) return;
  waited_ = true;
  try {
    if (future_.valid()) future_.get();  // the transport bounds its own waits
    wait_backend();
  } catch (...) {
    detail::rethrow_as_comm_error(description_, timeout_, explain_timeout_);
  }
  if (on_complete_) on_complete_();
}

}  // namespace tandem
