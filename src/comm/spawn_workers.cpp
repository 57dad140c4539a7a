#include "comm/spawn_workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "core/text.h"
#include "tandem/comm/shm_cleanup.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

extern char** environ;

namespace tandem::detail {
namespace {

constexpr const char* kSpawnVariables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "TANDEM_STORE_TOKEN", "TANDEM_ERROR_FILE",
    "TORCHELASTIC_ERROR_FILE", "TANDEM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS"};

std::string spawn_signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  const char* description = ::sigdescr_np(sig);
  return fmt::format("SIG{} ({})", abbrev ? abbrev : std::to_string(sig).c_str(),
                     description ? description : "unknown signal");
}

}  // namespace

bool is_spawn_variable(const std::string& name) {
  for (const char* reserved : kSpawnVariables) {
    if (name == reserved) return true;
  }
  return false;
}

std::vector<std::string> worker_environment(const SpawnOptions& options, int rank, int port,
                                            const std::string& token,
                                            const std::string& error_file, int threads) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  const bool omp_given = env.count("OMP_NUM_THREADS") || options.env.count("OMP_NUM_THREADS");
  for (const auto& [key, value] : options.env) env[key] = value;
  const std::string world = std::to_string(options.nprocs);
  // What `tandem launch` gives a worker on one node (tools/launch), so that
  // RankEnv::from_environment() and an Accelerator need nothing else.
  env["RANK"] = env["LOCAL_RANK"] = env["ROLE_RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = env["ROLE_WORLD_SIZE"] = world;
  env["GROUP_RANK"] = "0";
  env["GROUP_WORLD_SIZE"] = "1";
  env["ROLE_NAME"] = "default";
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TANDEM_STORE_TOKEN"] = token;
  env["TANDEM_RESTART_COUNT"] = env["TORCHELASTIC_RESTART_COUNT"] = "0";
  env["TORCHELASTIC_MAX_RESTARTS"] = "0";
  env["TANDEM_ERROR_FILE"] = env["TORCHELASTIC_ERROR_FILE"] = error_file;
  if (threads > 0 && !omp_given) env["OMP_NUM_THREADS"] = std::to_string(threads);
  std::vector<std::string> out;
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

ErrorFileDir::ErrorFileDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem-spawn-XXXXXX";
  TANDEM_CHECK(::mkdtemp(pattern.data()) != nullptr,
               "spawn: cannot create a directory for the workers' error files ({}): {}; set "
               "TMPDIR to a writable directory",
               pattern, std::strerror(errno));
  path_ = pattern;
}

ErrorFileDir::~ErrorFileDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

std::string ErrorFileDir::file(int rank) const {
  return fmt::format("{}/rank_{}.json", path_, rank);
}

std::string describe_failure(const WorkerFailure& failure,
                             const std::optional<ErrorRecord>& error_file) {
  if (failure.report && !failure.report->ok) {
    return failure.report->type + ": " + failure.report->message;
  }
  const std::string ended =
      failure.signal != 0 ? "was killed by signal " + spawn_signal_name(failure.signal)
                          : fmt::format("exited with code {}", failure.exit_code);
  if (error_file && !error_file->message.empty()) {
    // The terminate handler's record: an exception no one caught, in any thread.
    return fmt::format("{}: {} (uncaught; the process {})", error_file->type,
                       error_file->message, ended);
  }
  return "the process " + ended +
         " before the function returned (an exit call or a crash inside it?)";
}

WorkerSet::WorkerSet(int nprocs) : workers_(static_cast<size_t>(nprocs)) {
  for (int rank = 0; rank < nprocs; ++rank) at(rank).rank = rank;
}

WorkerSet::~WorkerSet() {
  for (auto& worker : workers_) {
    if (worker.pid > 0) {
      ::kill(-worker.pid, SIGKILL);
      ::kill(worker.pid, SIGKILL);
      while (::waitpid(worker.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
      remove_shared_memory_of(worker.pid);
    }
    if (worker.status_fd >= 0) ::close(worker.status_fd);
    if (worker.pidfd >= 0) ::close(worker.pidfd);
  }
}

void WorkerSet::signal_all(int sig) {
  for (const auto& worker : workers_) {
    if (worker.pid > 0) ::kill(-worker.pid, sig);  // the worker and whatever it started
  }
}

void WorkerSet::drain(SpawnedWorker& worker) {
  if (worker.status_fd < 0) return;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(worker.status_fd, buffer, sizeof(buffer));
    if (n > 0) {
      worker.report.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // every writer is gone
      ::close(worker.status_fd);
      worker.status_fd = -1;
    }
    return;  // EAGAIN: nothing more for now
  }
}

bool WorkerSet::reap(SpawnedWorker& worker, bool stopping) {
  int status = 0;
  const pid_t done = ::waitpid(worker.pid, &status, WNOHANG);
  if (done == 0 || (done < 0 && errno != ECHILD)) return false;
  // ECHILD: the status went elsewhere (the caller ignores SIGCHLD); the
  // report alone then says whether fn returned.
  if (done < 0) status = 0;
  // Shared memory the worker created and had not unlinked yet (killed while
  // its peers were still mapping it) goes with it, as under `tandem launch`.
  remove_shared_memory_of(worker.pid);
  worker.pid = 0;
  worker.end_ns = monotonic_ns();
  worker.stopped = stopping;
  if (WIFSIGNALED(status)) worker.signal = WTERMSIG(status);
  if (WIFEXITED(status)) worker.exit_code = WEXITSTATUS(status);
  drain(worker);  // the report was written before the exit
  if (worker.pidfd >= 0) ::close(worker.pidfd);
  worker.pidfd = -1;
  return true;
}

SuperviseResult WorkerSet::supervise(const SpawnOptions& options) {
  using std::chrono::nanoseconds;
  SuperviseResult result;
  std::vector<WorkerFailure> failures;
  const std::int64_t start = monotonic_ns();
  const std::int64_t deadline =
      options.timeout.count() > 0 ? start + nanoseconds(options.timeout).count() : -1;
  std::int64_t kill_at = -1;  // >= 0 once stopping: SIGKILL whoever is left then
  bool killed = false;
  auto begin_stop = [&] {
    if (kill_at >= 0) return;
    signal_all(SIGTERM);
    kill_at = monotonic_ns() + nanoseconds(options.grace_period).count();
  };

  for (;;) {
    bool running = false;
    for (auto& worker : workers_) {
      if (worker.pid <= 0) continue;
      drain(worker);
      if (!reap(worker, kill_at >= 0)) {
        running = true;
        continue;
      }
      std::optional<WorkerReport> report = decode_report(worker.report);
      const bool threw = report && !report->ok;
      const bool returned = report && report->ok && worker.exit_code == 0 && worker.signal == 0;
      if (returned || (worker.stopped && !threw)) continue;  // done, or ended by the stop
      WorkerFailure failure;
      failure.rank = worker.rank;
      failure.report = report;
      failure.exit_code = worker.exit_code;
      failure.signal = worker.signal;
      failure.time_ns = threw ? report->time_ns : worker.end_ns;
      failure.after_stop = worker.stopped;
      failures.push_back(failure);
      begin_stop();
    }
    if (!running) break;
    const std::int64_t now = monotonic_ns();
    if (deadline >= 0 && now >= deadline && kill_at < 0) {
      result.timed_out = true;
      for (const auto& worker : workers_) {
        if (worker.pid > 0) result.running_at_timeout.push_back(worker.rank);
      }
      begin_stop();
    }
    if (kill_at >= 0 && !killed && now >= kill_at) {
      signal_all(SIGKILL);
      killed = true;
    }
    // Wake on a report, on an exit (pidfd), or at the next deadline; 100 ms
    // at most in case pidfd_open was not available.
    std::int64_t wake = now + 100'000'000;
    if (deadline >= 0 && kill_at < 0) wake = std::min(wake, deadline);
    if (kill_at >= 0 && !killed) wake = std::min(wake, kill_at);
    std::vector<pollfd> fds;
    for (const auto& worker : workers_) {
      if (worker.pid <= 0) continue;
      if (worker.status_fd >= 0) fds.push_back({worker.status_fd, POLLIN, 0});
      if (worker.pidfd >= 0) fds.push_back({worker.pidfd, POLLIN, 0});
    }
    const int wait_ms = static_cast<int>(std::max<std::int64_t>(0, (wake - now) / 1'000'000) + 1);
    ::poll(fds.data(), fds.size(), wait_ms);
  }

  if (result.timed_out) {
    // What failed only because the deadline stopped it is no cause.
    failures.erase(std::remove_if(failures.begin(), failures.end(),
                                  [](const auto& f) { return f.after_stop; }),
                   failures.end());
  }
  if (failures.empty()) return result;
  // The root cause: the earliest failure of its own; a CommError (a peer
  // went away, a collective timed out) only when there is no other.
  auto priority = [](const WorkerFailure& f) {
    const bool comm = f.report && f.report->comm_error;
    return std::make_pair(comm, f.time_ns);
  };
  auto root = std::min_element(
      failures.begin(), failures.end(),
      [&](const auto& a, const auto& b) { return priority(a) < priority(b); });
  result.root_cause = *root;
  std::vector<int> also_failed;
  for (const auto& failure : failures) {
    if (failure.rank != root->rank) also_failed.push_back(failure.rank);
  }
  std::sort(also_failed.begin(), also_failed.end());
  std::vector<int> stopped;
  for (const auto& worker : workers_) {
    const bool failed = std::count(also_failed.begin(), also_failed.end(), worker.rank) > 0;
    if (worker.stopped && !failed && worker.rank != root->rank) stopped.push_back(worker.rank);
  }
  std::string others;
  if (!also_failed.empty()) others = "rank(s) " + rank_list(also_failed) + " failed as well";
  if (!stopped.empty()) {
    others += (others.empty() ? "" : "; ") + std::string("rank(s) ") + rank_list(stopped) +
              " were stopped";
  }
  result.others = others;
  return result;
}

}  // namespace tandem::detail
