#include "launch/worker_group.h"

#include <sched.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

#include "launch/cpu_affinity.h"
#include "tandem/comm/shm_cleanup.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {
namespace {

int g_signal_pipe[2] = {-1, -1};
bool g_in_slurm_job = false;

void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  (void)!::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

bool repeat_stops_now(int repeat, bool in_slurm_job) {
  return !(in_slurm_job && repeat == SIGTERM);
}

void set_launcher_in_slurm_job(bool in_slurm_job) { g_in_slurm_job = in_slurm_job; }

void install_launcher_signal_handlers() {
  if (g_signal_pipe[0] >= 0) return;
  TANDEM_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2 failed: {}",
               std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2}) {
    ::sigaction(sig, &sa, nullptr);
  }
  ::signal(SIGPIPE, SIG_IGN);  // a closed console must not kill the launcher
}

int take_stop_signal() {
  int first = 0;
  unsigned char sig = 0;
  while (g_signal_pipe[0] >= 0 && ::read(g_signal_pipe[0], &sig, 1) == 1) {
    const bool stops = sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
    if (stops && first == 0) first = sig;
  }
  return first;
}

WorkerGroup::WorkerGroup(std::vector<std::string> argv, std::vector<WorkerSpec> workers,
                         double grace_period_s, bool prefix_output)
    : argv_(std::move(argv)),
      workers_(std::move(workers)),
      grace_period_s_(grace_period_s),
      pump_(prefix_output) {}

void WorkerGroup::spawn(const WorkerSpec& spec) {
  int out_pipe[2];
  int err_pipe[2];
  TANDEM_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
               "cannot create pipes for rank {}: {}", spec.global_rank, std::strerror(errno));
  // Everything the child touches is prepared before fork(): between fork and
  // exec only async-signal-safe calls are allowed (the store thread runs).
  std::vector<std::string> argv = spec.argv.empty() ? argv_ : spec.argv;
  std::vector<std::string> env = spec.env;
  int in_pipe[2] = {-1, -1};
  if (spec.stdin_text) {
    TANDEM_CHECK(::pipe2(in_pipe, O_CLOEXEC) == 0, "cannot create a pipe for rank {}: {}",
                 spec.global_rank, std::strerror(errno));
  }
  std::vector<char*> c_argv = c_strings(argv);
  std::vector<char*> c_env = c_strings(env);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : spec.cpus) CPU_SET(cpu, &cpus);
  const std::string pin_failed = fmt::format(
      "tandem launch: rank {}: enable_cpu_affinity: cannot pin to CPUs {} (sched_setaffinity: ",
      spec.global_rank, cpu_list_text(spec.cpus));
  const pid_t launcher = ::getpid();
  sigset_t empty_mask;
  sigemptyset(&empty_mask);

  // Every signal is blocked across fork() until the child has put the default
  // handlers back: a signal that reached the child before that (the SIGTERM
  // that stops a failed group, say) would run the launcher's handler, which
  // writes to the pipe both share, and read as a signal to the launcher.
  sigset_t all_signals;
  sigset_t launcher_mask;
  sigfillset(&all_signals);
  ::pthread_sigmask(SIG_SETMASK, &all_signals, &launcher_mask);
  pid_t pid = ::fork();
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &launcher_mask, nullptr);
  TANDEM_CHECK(pid >= 0, "fork failed for rank {}: {}", spec.global_rank, std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(125);  // launcher already gone
    ::signal(SIGPIPE, SIG_DFL);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2}) {
      ::signal(sig, SIG_DFL);
    }
    ::sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    if (in_pipe[0] >= 0) {
      ::dup2(in_pipe[0], STDIN_FILENO);
    } else {
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    }
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      const char* why = std::strerror(errno);
      const char* tail = "); running unpinned\n";
      (void)!::write(STDERR_FILENO, pin_failed.data(), pin_failed.size());
      (void)!::write(STDERR_FILENO, why, std::strlen(why));
      (void)!::write(STDERR_FILENO, tail, std::strlen(tail));
    }
    ::execvpe(c_argv[0], c_argv.data(), c_env.data());
    const char* msg = "tandem launch: cannot execute the program: ";
    (void)!::write(STDERR_FILENO, msg, std::strlen(msg));
    const char* why = std::strerror(errno);
    (void)!::write(STDERR_FILENO, why, std::strlen(why));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so signal_all never races the child
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  pump_.add_stream(out_pipe[0], spec.global_rank, false, spec.stdout_sink, spec.host);
  pump_.add_stream(err_pipe[0], spec.global_rank, true, spec.stderr_sink, spec.host);
  pids_.push_back(pid);
  groups_.push_back(pid);
  if (in_pipe[0] >= 0) {
    ::close(in_pipe[0]);
    // Usually a few hundred bytes, which the pipe holds without a reader
    // (more waits for the child to read). The write end stays open
    // (close-on-exec, so no other child holds it) until this process exits.
    const std::string& text = *spec.stdin_text;
    // An error means the child is gone: reap() reports it.
    (void)fs::write_all(in_pipe[1], text.data(), text.size());
  }
  stdin_fds_.push_back(in_pipe[1]);
}

void WorkerGroup::signal_all(int sig) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] <= 0) {
      // The worker is gone; what it started in its group (a child that
      // ignores SIGTERM, a backgrounded command of a shell script) may not
      // be, and is stopped with the job (Slurm's warnings are for workers).
      if (sig != SIGUSR1 && sig != SIGUSR2) ::kill(-groups_[i], sig);
      continue;
    }
    if (sig != SIGKILL && stdin_fds_[i] >= 0) {
      // A host's launcher (through ssh) stops its workers when its stdin
      // closes, and its ssh then ends with it: the job is gone when it is.
      ::close(stdin_fds_[i]);
      stdin_fds_[i] = -1;
      continue;
    }
    ::kill(-pids_[i], sig);  // the worker's whole process group
  }
}

void WorkerGroup::reap(GroupResult& result) {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (pids_[i] <= 0) continue;
    int status = 0;
    pid_t done = ::waitpid(pids_[i], &status, WNOHANG);
    if (done != pids_[i]) continue;
    WorkerExit exit;
    exit.global_rank = workers_[i].global_rank;
    exit.pid = pids_[i];
    exit.seconds = now_s() - start_;
    exit.wall_time = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    if (stdin_fds_[i] >= 0) ::close(stdin_fds_[i]);
    stdin_fds_[i] = -1;
    if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
    if (WIFEXITED(status)) exit.exit_code = WEXITSTATUS(status);
    exit.stopped = stopping_;
    // Shared memory the worker created and had not yet unlinked (it died
    // while its peers were still mapping it) goes with it.
    remove_shared_memory_of(pids_[i]);
    pids_[i] = 0;
    result.exits.push_back(exit);
    result.preempted = result.preempted || exit.preempted();
    if (exit.failed() && !result.has_first_failure && result.launcher_signal == 0 &&
        result.stop_reason.empty()) {
      if (secondary_ && secondary_(exit)) {
        if (!secondary_failure_) {
          secondary_failure_ = exit;
          cause_deadline_ = now_s() + cause_wait_s_;
        }
      } else {
        result.has_first_failure = true;
        result.first_failure = exit;
      }
    }
  }
}

bool WorkerGroup::leftovers_alive() const {
  for (int group : groups_) {
    if (::kill(-group, 0) == 0) return true;
  }
  return false;
}

void WorkerGroup::end_leftovers(bool at_once) {
  if (!leftovers_alive()) return;
  if (!at_once) {
    for (int group : groups_) ::kill(-group, SIGTERM);
    // Leftovers save nothing (a preempted job's long grace period is for
    // its workers' checkpoints): a few seconds at most.
    const double deadline = now_s() + std::min(grace_period_s_, 10.0);
    while (leftovers_alive() && now_s() < deadline) ::usleep(20'000);
  }
  for (int group : groups_) ::kill(-group, SIGKILL);
}

GroupResult WorkerGroup::run() {
  install_launcher_signal_handlers();
  start_ = now_s();
  for (const auto& spec : workers_) spawn(spec);

  GroupResult result;
  double kill_deadline = -1;  // when >= 0: SIGKILL whoever is left at that time
  bool killed = false;
  double drain_deadline = -1;
  // Hosts' launchers stop their own workers within the grace period; they
  // get a few seconds more to report it before their ssh is killed.
  bool remote = false;
  for (const auto& spec : workers_) remote = remote || spec.stdin_text.has_value();
  auto begin_shutdown = [&](int sig) {
    if (kill_deadline >= 0) return;
    stopping_ = true;
    signal_all(sig);
    kill_deadline = now_s() + grace_period_s_ + (remote ? 10.0 : 0.0);
  };

  double next_check = stop_check_ ? now_s() + stop_check_every_s_ : -1;
  for (;;) {
    reap(result);
    bool all_reaped = true;
    for (pid_t pid : pids_) all_reaped = all_reaped && pid == 0;
    if (secondary_failure_ && !result.has_first_failure &&
        (all_reaped || now_s() >= cause_deadline_ || result.launcher_signal != 0 ||
         !result.stop_reason.empty())) {
      // No other cause came in time: the consequence is all there is to say.
      result.has_first_failure = true;
      result.first_failure = *secondary_failure_;
    }
    if (result.has_first_failure) begin_shutdown(SIGTERM);
    if (next_check >= 0 && !stopping_ && !all_reaped && now_s() >= next_check) {
      result.stop_reason = stop_check_();
      if (!result.stop_reason.empty()) begin_shutdown(SIGTERM);
      next_check = now_s() + stop_check_every_s_;
    }
    if (kill_deadline >= 0 && !killed && now_s() >= kill_deadline) {
      signal_all(SIGKILL);
      killed = true;
    }
    std::vector<int> fds = pump_.open_fds();
    if (all_reaped) {
      // Grandchildren may hold a pipe open; give them a moment, no more.
      if (fds.empty()) break;
      if (drain_deadline < 0) drain_deadline = now_s() + 1.0;
      if (now_s() >= drain_deadline) break;
    }
    std::vector<pollfd> polled;
    polled.push_back({g_signal_pipe[0], POLLIN, 0});
    polled.push_back({watch_fd_, POLLIN, 0});  // poll() skips a negative fd
    for (int fd : fds) polled.push_back({fd, POLLIN, 0});
    int n = ::poll(polled.data(), polled.size(), 100);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    if (polled[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      char scratch[256];
      const ssize_t got = ::read(watch_fd_, scratch, sizeof(scratch));
      if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {  // the head is gone
        watch_fd_ = -1;
        if (result.launcher_signal == 0) result.launcher_signal = SIGHUP;
        begin_shutdown(SIGTERM);
      }
    }
    if (polled[0].revents & POLLIN) {
      unsigned char sig;
      while (::read(g_signal_pipe[0], &sig, 1) == 1) {
        if (sig == SIGCHLD) continue;
        if (sig == SIGUSR1 || sig == SIGUSR2) {
          // A warning (Slurm's --signal before a time limit): the workers
          // decide what it means (the preemption block); the job goes on.
          signal_all(sig);
          continue;
        }
        if (result.launcher_signal != 0) {
          if (!repeat_stops_now(sig, g_in_slurm_job)) continue;
          signal_all(SIGKILL);  // second signal: stop now
          killed = true;
        }
        result.launcher_signal = sig;
        begin_shutdown(sig == SIGHUP || sig == SIGQUIT ? SIGTERM : sig);
      }
    }
    for (size_t i = 2; i < polled.size(); ++i) {
      if (polled[i].revents & (POLLIN | POLLHUP | POLLERR)) pump_.on_readable(polled[i].fd);
    }
  }
  end_leftovers(/*at_once=*/killed);
  pump_.close_all();
  for (int& fd : stdin_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  result.success =
      result.launcher_signal == 0 && !result.has_first_failure && result.stop_reason.empty();
  return result;
}

}  // namespace tandem::cli
