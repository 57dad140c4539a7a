// `ssh HOST true` probes of a --hostfile job's hosts (ssh_probe.h).

#include "launch/ssh_probe.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <sstream>

namespace tandem::cli {
namespace {

double probe_clock_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<std::string> split_ssh_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// Starts `ssh ... HOST true` in a process group of its own, stdin and
// stdout (and stderr when `quiet`) on /dev/null; returns its pid, or -1 when
// it cannot. Forked rather than posix_spawn()ed so that the ssh gets
// PR_SET_PDEATHSIG: a head killed mid-probe leaves no ssh behind.
pid_t start_ssh_true(const LaunchOptions& opts, const std::string& host, bool quiet) {
  std::vector<std::string> argv = ssh_argv(opts, host, /*connect_timeout_s=*/5);
  argv.emplace_back("true");
  // Everything the child touches is prepared before fork(): it may make
  // async-signal-safe calls only.
  std::vector<char*> c_argv;
  for (auto& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) return -1;
  const pid_t head = ::getpid();
  sigset_t all_signals;
  sigset_t head_mask;
  sigset_t empty_mask;
  sigfillset(&all_signals);
  sigemptyset(&empty_mask);
  // As in WorkerGroup::spawn: a signal reaching the child before it resets
  // the handlers would run the head's, and read as a signal to the head.
  ::pthread_sigmask(SIG_SETMASK, &all_signals, &head_mask);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != head) ::_exit(125);  // the head is already gone
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    ::dup2(devnull, STDIN_FILENO);
    ::dup2(devnull, STDOUT_FILENO);
    if (quiet) ::dup2(devnull, STDERR_FILENO);
    ::execvp(c_argv[0], c_argv.data());
    ::_exit(127);
  }
  ::pthread_sigmask(SIG_SETMASK, &head_mask, nullptr);
  ::close(devnull);
  if (pid > 0) ::setpgid(pid, pid);  // also from here, so that the kill below never races it
  return pid;
}

bool exited_zero(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

}  // namespace

std::vector<std::string> ssh_argv(const LaunchOptions& opts, const std::string& host,
                                  int connect_timeout_s) {
  std::vector<std::string> argv = {"ssh"};
  for (auto& word : split_ssh_words(opts.launcher_args)) argv.push_back(word);
  if (opts.ssh_port > 0) argv.insert(argv.end(), {"-p", std::to_string(opts.ssh_port)});
  // No password prompts; a host that stops answering is noticed in 15 s,
  // one that drops the connection's packets in connect_timeout_s rather than
  // after the kernel's SYN retries (about 2 minutes).
  argv.insert(argv.end(), {"-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o",
                           "ServerAliveCountMax=3", "-o",
                           "ConnectTimeout=" + std::to_string(connect_timeout_s), host});
  return argv;
}

bool reachable(const LaunchOptions& opts, const std::string& host) {
  const pid_t pid = start_ssh_true(opts, host, /*quiet=*/false);
  if (pid < 0) return false;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return exited_zero(status);
}

RejoinProbe::RejoinProbe(const LaunchOptions& opts, std::vector<std::string> hosts,
                         double every_s)
    : opts_(opts), every_s_(every_s) {
  const double now = probe_clock_s();
  for (auto& host : hosts) probes_.push_back({std::move(host), 0, now});
}

RejoinProbe::~RejoinProbe() {
  for (const auto& probe : probes_) {
    if (probe.pid <= 0) continue;
    ::kill(-probe.pid, SIGKILL);  // ssh and anything it started (a ProxyCommand)
    ::kill(probe.pid, SIGKILL);
    while (::waitpid(probe.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

std::string RejoinProbe::check() {
  const double now = probe_clock_s();
  for (auto& probe : probes_) {
    if (probe.pid > 0) {
      int status = 0;
      const pid_t done = ::waitpid(probe.pid, &status, WNOHANG);
      if (done == 0) continue;  // still connecting
      const bool yes = done == probe.pid && exited_zero(status);
      probe.pid = 0;
      if (yes) return probe.host;
    }
    if (now - probe.last_start_s >= every_s_) {
      probe.pid = std::max<pid_t>(0, start_ssh_true(opts_, probe.host, /*quiet=*/true));
      probe.last_start_s = now;
    }
  }
  return "";
}

}  // namespace tandem::cli
