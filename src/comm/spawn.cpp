// tandem::spawn: fork the workers, host their store, supervise them.
//
// Why fork and not re-executing /proc/self/exe: a C++ program has no
// `if __name__ == "__main__"` guard, so a re-executed worker would run main()
// again up to the spawn() call (printing, parsing stdin, creating files, or
// in a test binary running every other test first), and fn would have to be
// found again by some registered id instead of simply being called. fork()
// runs exactly fn, with everything it captured. Its cost is the rule that
// the parent must not hold threads the workers need (spawn.h); spawn()
// enforces the dangerous case (a live ProcessGroup) and handles the common
// one (LibTorch's idle OpenMP pool).

#include "tandem/comm/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "comm/process_group_impl.h"
#include "comm/spawn_worker.h"
#include "comm/spawn_workers.h"
#include "core/text.h"
#include "tandem/comm/store_server.h"
#include "tandem/core/error_file.h"
#include "tandem/core/logging.h"

extern char** environ;

namespace tandem {
namespace {

using detail::SpawnedWorker;

// Threads of this process, counted in /proc/self/task.
int process_thread_count() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return 1;
  int count = 0;
  while (dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.';
  ::closedir(dir);
  return count;
}

void check_spawn_options(const SpawnOptions& options) {
  TANDEM_CHECK_ARG(options.nprocs >= 1 && options.nprocs <= 4096,
                   "spawn: nprocs is {}; give the number of worker processes, 1 to 4096",
                   options.nprocs);
  TANDEM_CHECK_ARG(options.master_port >= 0 && options.master_port <= 65535,
                   "spawn: master_port {} is out of range; use 1-65535, or 0 for a free port",
                   options.master_port);
  TANDEM_CHECK_ARG(options.timeout.count() >= 0 && options.grace_period.count() >= 0,
                   "spawn: timeout and grace_period must not be negative");
  for (const auto& [key, value] : options.env) {
    TANDEM_CHECK_ARG(!detail::is_spawn_variable(key),
                     "spawn: SpawnOptions::env sets {}, which spawn() sets for each worker "
                     "itself; remove it from env",
                     key);
    TANDEM_CHECK_ARG(!key.empty() && key.find('=') == std::string::npos,
                     "spawn: SpawnOptions::env has an invalid variable name '{}'", key);
  }
  TANDEM_CHECK_ARG(detail::live_process_groups().load() == 0,
                   "spawn: this process holds a ProcessGroup (an Accelerator, say) of more than "
                   "one rank; its threads would be missing in the forked workers. Create the "
                   "Accelerator or ProcessGroup inside the function you pass to spawn(), and "
                   "let the one out here go first");
}

// How many intra-op threads a worker sets itself (0: leave LibTorch's).
int worker_threads(const SpawnOptions& options, bool other_threads) {
  if (other_threads) return 1;  // the OpenMP pool did not survive fork()
  auto own = options.env.find("OMP_NUM_THREADS");
  if (own != options.env.end()) return std::max(0, std::atoi(own->second.c_str()));
  if (options.nprocs > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) return 1;
  return 0;
}

// Forks worker `rank`. The child never returns from here.
void fork_worker(const std::function<void(int)>& fn, SpawnedWorker& worker,
                 std::vector<char*>& env, int threads, const std::vector<SpawnedWorker>& all) {
  int status[2];
  TANDEM_CHECK(::pipe2(status, O_CLOEXEC) == 0, "spawn: cannot create a pipe for rank {}: {}",
               worker.rank, std::strerror(errno));
  // Anything buffered now would be written once more by every worker.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  // Signals stay blocked across fork() until the child has reset the
  // caller's handlers: the SIGTERM that stops a failed job must not run them.
  sigset_t all_signals;
  sigset_t caller_mask;
  sigfillset(&all_signals);
  ::pthread_sigmask(SIG_SETMASK, &all_signals, &caller_mask);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);  // the caller is already gone
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) ::signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::close(status[0]);
    for (const auto& other : all) {  // the siblings' pipes are the parent's business
      if (other.status_fd >= 0) ::close(other.status_fd);
      if (other.pidfd >= 0) ::close(other.pidfd);
    }
    environ = env.data();  // no setenv(): no lock another thread may have held
    detail::run_worker(fn, worker.rank, status[1], threads);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
  ::close(status[1]);
  if (pid < 0) {
    ::close(status[0]);
    TANDEM_THROW(Error, "spawn: fork failed for rank {}: {}", worker.rank,
                 std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // from this side too, so a stop never races the child
  worker.pid = pid;
  worker.status_fd = status[0];
  ::fcntl(worker.status_fd, F_SETFL, O_NONBLOCK);
  worker.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

}  // namespace

void spawn(const std::function<void(int rank)>& fn, const SpawnOptions& options) {
  TANDEM_CHECK_ARG(static_cast<bool>(fn), "spawn: the function to run is empty");
  check_spawn_options(options);
  // Counted before the store's own thread exists.
  const int threads_before = process_thread_count();
  const bool other_threads = threads_before > 1;
  if (other_threads) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      log_warn("spawn: this process already runs {} threads (LibTorch's intra-op pool after a "
               "parallel operation, for instance); the forked workers inherit none of them and "
               "use one intra-op thread each. Call spawn() earlier to avoid this",
               threads_before);
    }
  }

  // The store runs before any worker exists, so at fork() its thread waits
  // in epoll with no client and holds no lock a worker could need.
  StoreServerOptions store_options;
  store_options.host = "127.0.0.1";
  store_options.port = options.master_port;
  store_options.token = random_store_token();
  StoreServer store(store_options);

  detail::ErrorFileDir error_dir;
  std::vector<std::vector<std::string>> envs;
  std::vector<std::vector<char*>> env_ptrs;
  for (int rank = 0; rank < options.nprocs; ++rank) {
    envs.push_back(detail::worker_environment(options, rank, store.port(), store_options.token,
                                              error_dir.file(rank),
                                              worker_threads(options, other_threads)));
  }
  for (auto& env : envs) {  // pointers only once `envs` no longer moves
    env_ptrs.emplace_back();
    for (auto& entry : env) env_ptrs.back().push_back(entry.data());
    env_ptrs.back().push_back(nullptr);
  }

  detail::WorkerSet workers(options.nprocs);
  for (int rank = 0; rank < options.nprocs; ++rank) {
    fork_worker(fn, workers.at(rank), env_ptrs[static_cast<size_t>(rank)],
                worker_threads(options, other_threads), workers.all());
  }
  detail::SuperviseResult result = workers.supervise(options);
  if (result.timed_out && !result.root_cause) {
    const std::string running = detail::rank_list(result.running_at_timeout);
    TANDEM_THROW(TimeoutError,
                 "spawn: the {} workers did not finish within {} ms; rank(s) {} were still "
                 "running and have been stopped. Raise SpawnOptions::timeout, or find what they "
                 "wait for",
                 options.nprocs, options.timeout.count(), running);
  }
  if (!result.root_cause) return;
  const detail::WorkerFailure& root = *result.root_cause;
  const std::string what =
      detail::describe_failure(root, read_error_file(error_dir.file(root.rank)));
  std::string message = fmt::format("spawn: rank {} of {} failed: {}", root.rank,
                                    options.nprocs, what);
  if (!result.others.empty()) message += " [" + result.others + "]";
  throw SpawnError(detail::decorate_error(message, __FILE__, __LINE__), root.rank, what);
}

void spawn(const std::function<void(int rank)>& fn, int nprocs) {
  SpawnOptions options;
  options.nprocs = nprocs;
  spawn(fn, options);
}

void spawn(const std::function<void()>& fn, int nprocs) {
  TANDEM_CHECK_ARG(static_cast<bool>(fn), "spawn: the function to run is empty");
  spawn([&fn](int) { fn(); }, nprocs);
}

}  // namespace tandem
