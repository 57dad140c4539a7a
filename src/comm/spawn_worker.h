#pragma once
// The worker side of tandem::spawn (spawn.h): what a forked child runs, and
// the one report it writes to its status pipe before it exits.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace tandem::detail {

// A worker's last word, read by the parent. No report at all means the
// process ended before fn returned or threw (it called exit, got a signal, or terminated).
struct WorkerReport {
  bool ok = false;           // fn returned
  bool comm_error = false;   // fn threw tandem::CommError (a peer went away, a timeout)
  std::int64_t time_ns = 0;  // CLOCK_MONOTONIC when fn threw: one clock for all processes
  std::string type;          // "std::runtime_error", "tandem::UsageError", ...
  std::string message;       // what()
};

std::string encode_report(const WorkerReport& report);
// nullopt for an empty or truncated record.
std::optional<WorkerReport> decode_report(const std::string& bytes);

// CLOCK_MONOTONIC in nanoseconds.
std::int64_t monotonic_ns();

// Runs in the forked child, after the environment is in place: sets the
// intra-op thread count (`threads` > 0), installs the error-file handler,
// runs fn(rank), flushes stdout/stderr, writes the report to `status_fd`
// and _exit()s: 0 when fn returned, 1 when it threw. Never returns, never
// runs the parent's atexit handlers or static destructors.
[[noreturn]] void run_worker(const std::function<void(int)>& fn, int rank, int status_fd,
                             int threads);

}  // namespace tandem::detail
