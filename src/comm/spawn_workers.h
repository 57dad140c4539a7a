#pragma once
// The parent side of tandem::spawn (spawn.h): each worker's environment, the
// set of forked workers, and the supervision loop that stops them all after
// the first failure. Used by spawn() from one thread.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/spawn_worker.h"
#include "tandem/comm/spawn.h"
#include "tandem/core/error_file.h"

namespace tandem::detail {

// True for the variables spawn() sets per worker (RANK, MASTER_PORT, ...).
bool is_spawn_variable(const std::string& name);

// The complete environment of worker `rank`, as "KEY=VALUE": the caller's,
// without a launcher's error file, plus options.env and the rank variables
// of `tandem launch` (store on 127.0.0.1:`port`, agent store, `token`).
std::vector<std::string> worker_environment(const SpawnOptions& options, int rank, int port,
                                            const std::string& token,
                                            const std::string& error_file, int threads);

// A temporary directory for the workers' error files, removed with them.
class ErrorFileDir {
 public:
  ErrorFileDir();
  ~ErrorFileDir();
  ErrorFileDir(const ErrorFileDir&) = delete;
  ErrorFileDir& operator=(const ErrorFileDir&) = delete;
  std::string file(int rank) const;

 private:
  std::string path_;
};

struct SpawnedWorker {
  int rank = 0;
  pid_t pid = 0;       // 0 before fork() and once reaped
  int status_fd = -1;  // read end of the worker's status pipe
  int pidfd = -1;      // readable when the worker exits; -1 without pidfd_open
  std::string report;  // bytes read from status_fd
  int exit_code = 0;
  int signal = 0;
  bool stopped = false;  // ended after the stop began
  std::int64_t end_ns = 0;
};

struct WorkerFailure {
  int rank = 0;
  std::optional<WorkerReport> report;  // fn threw: its exception
  int exit_code = 0;
  int signal = 0;
  std::int64_t time_ns = 0;  // when it threw, else when it was seen to end
  bool after_stop = false;   // ended after the stop began
};

struct SuperviseResult {
  std::optional<WorkerFailure> root_cause;
  std::string others;  // what became of the other workers, for the message
  bool timed_out = false;
  std::vector<int> running_at_timeout;
};

// "std::runtime_error: boom", or how the process ended without a report,
// completed by its error file when the terminate handler wrote one.
std::string describe_failure(const WorkerFailure& failure,
                             const std::optional<ErrorRecord>& error_file);

// The forked workers. The destructor SIGKILLs and reaps any still running
// (an exception in the parent never leaves one behind) and closes the pipes.
class WorkerSet {
 public:
  explicit WorkerSet(int nprocs);
  ~WorkerSet();
  WorkerSet(const WorkerSet&) = delete;
  WorkerSet& operator=(const WorkerSet&) = delete;

  SpawnedWorker& at(int rank) { return workers_[static_cast<size_t>(rank)]; }
  const std::vector<SpawnedWorker>& all() const { return workers_; }

  // Waits for every worker. After the first failure (or options.timeout)
  // sends SIGTERM to the others' process groups, then SIGKILL after
  // options.grace_period. Returns once all are reaped.
  SuperviseResult supervise(const SpawnOptions& options);

 private:
  void signal_all(int sig);
  void drain(SpawnedWorker& worker);
  bool reap(SpawnedWorker& worker, bool stopping);

  std::vector<SpawnedWorker> workers_;
};

}  // namespace tandem::detail
