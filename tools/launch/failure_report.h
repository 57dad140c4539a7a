#pragma once
// Why a worker group failed: every worker's exit, joined with the error
// file it wrote (if any), and the root cause (the earliest failure).

#include <optional>
#include <string>
#include <vector>

#include "launch/worker_group.h"
#include "tandem/core/error_file.h"

namespace tandem::cli {

struct WorkerFailure {
  WorkerExit exit;
  std::optional<ErrorRecord> error;  // from the worker's error file
  std::string error_file;
  // Seconds since the Unix epoch: the error file's time when it has one,
  // else when the launcher saw the process end.
  double time() const { return error && error->time > 0 ? error->time : exit.wall_time; }
};

struct FailureReport {
  WorkerFailure root_cause;
  std::vector<WorkerFailure> others;  // every other worker, in exit order
};

// The path of global rank `rank`'s error file under `attempt_dir`.
std::string error_file_path(const std::string& attempt_dir, int rank);

// Whether `failure` is the usual consequence of a peer's failure rather
// than a cause: a CommError in its error file, or, with no error file, death
// by SIGPIPE (it wrote to a connection its peer had closed).
bool is_consequence(const WorkerFailure& failure);

// Reads the error files of `result`'s workers and picks the root cause:
// the earliest failure (error-file time, else exit time) among the workers
// that failed on their own or reported an error, a consequence
// (is_consequence) counting only when nothing else failed.
FailureReport make_failure_report(const GroupResult& result, const std::string& attempt_dir);

// "rank 1 (pid 42) exited with code 3 after 1.20 s: tandem::UsageError: ..."
// lines for stderr; `logs` names where the root cause's logs and error file
// are kept ("": they are not kept).
std::string render_failure_report(const FailureReport& report, const std::string& logs);

// A signal that stopped the launcher while its workers were already
// stopping for a failure must not hide that failure: ". Before it, the job
// had failed: <render_failure_report>", or "" when no worker had failed.
// `logs_kept`: the attempt's logs stay under `attempt_dir` (--log-dir).
std::string failure_before_signal(const GroupResult& result, const std::string& attempt_dir,
                                  bool logs_kept);

// "exited with code 3" / "was killed by signal 9 (SIGKILL)".
std::string describe_exit(const WorkerExit& exit);

}  // namespace tandem::cli
