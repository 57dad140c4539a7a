#pragma once
// Real processes for end-to-end tests: run a command with a deadline, or
// start it in the background and signal it. Output goes to temp files.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tandem::testing {

#ifndef TANDEM_BIN_DIR
#error "TANDEM_BIN_DIR must point at <build>/bin"
#endif

inline std::string bin(const std::string& name) { return std::string(TANDEM_BIN_DIR) + "/" + name; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh empty directory under /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir() {
    char templ[] = "/tmp/tandem_test_XXXXXX";
    path_ = ::mkdtemp(templ);
  }
  ~TempDir() { (void)!std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct ProcessResult {
  int exit_code = -1;  // valid when signal == 0 and !timed_out
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string out;
  std::string err;
};

// True while `pid` exists and is not a zombie.
inline bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string content;
  std::getline(stat, content);
  auto close_paren = content.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < content.size() &&
         content[close_paren + 2] != 'Z';
}

inline int remaining_ms(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<std::int64_t>(0, left.count()));
}

// Waits until `pid` has terminated (any process, not only a child), or
// `timeout_s` passes. Blocks in poll() on a pidfd: no sleeping.
inline bool wait_for_exit(pid_t pid, double timeout_s) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return !process_alive(pid);  // already gone (ESRCH)
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s));
  bool exited = false;
  while (!exited) {
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) exited = true;
    if (n == 0) break;  // timed out
  }
  ::close(fd);
  return exited || !process_alive(pid);
}

// Waits until `condition` holds, re-checking whenever a file in `dir` is
// created or written (inotify), or until `timeout_s` passes.
template <typename Fn>
bool wait_for_files(const std::string& dir, Fn condition, double timeout_s) {
  int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  ::inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MODIFY);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(timeout_s));
  bool done = condition();
  while (!done && remaining_ms(deadline) > 0) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, remaining_ms(deadline)) <= 0) break;
    char events[4096];
    while (::read(fd, events, sizeof(events)) > 0) {
    }
    done = condition();
  }
  ::close(fd);
  return done || condition();
}

class BackgroundProcess {
 public:
  BackgroundProcess(const std::vector<std::string>& argv,
                    const std::vector<std::string>& extra_env = {}) {
    out_path_ = dir_.path() + "/out";
    err_path_ = dir_.path() + "/err";
    start_ = std::chrono::steady_clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(err, 2);
      for (const auto& kv : extra_env) ::putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  ~BackgroundProcess() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void send(int sig) { ::kill(pid_, sig); }
  // Where its stdout and stderr go, to read while it runs.
  const std::string& out_path() const { return out_path_; }
  const std::string& err_path() const { return err_path_; }

  // Waits up to timeout_s; on timeout kills the process and says so.
  ProcessResult wait(double timeout_s) {
    ProcessResult r;
    int status = 0;
    bool done = wait_for_exit(pid_, timeout_s) && ::waitpid(pid_, &status, 0) == pid_;
    if (!done) {
      r.timed_out = true;
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    reaped_ = true;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = read_file(out_path_);
    r.err = read_file(err_path_);
    return r;
  }

 private:
  TempDir dir_;
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::chrono::steady_clock::time_point start_;
};

// Runs `command` through the shell, its stdout (add " 2>&1" for stderr too)
// appended to `output`; its exit code, or -1 when it did not exit.
inline int run_shell_capture(const std::string& command, std::string& output) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s,
                                 const std::vector<std::string>& extra_env = {}) {
  BackgroundProcess p(argv, extra_env);
  return p.wait(timeout_s);
}

}  // namespace tandem::testing
