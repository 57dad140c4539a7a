#pragma once
// Real processes for end-to-end tests: run a command with a deadline, or
// start it in the background and signal it. Output goes to temp files.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
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

// Polls `condition` every 20 ms until it holds or `timeout_s` passes.
template <typename Fn>
bool wait_until(Fn condition, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
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

  // Waits up to timeout_s; on timeout kills the process and says so.
  ProcessResult wait(double timeout_s) {
    ProcessResult r;
    int status = 0;
    bool done = wait_until([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout_s);
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

inline ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s,
                                 const std::vector<std::string>& extra_env = {}) {
  BackgroundProcess p(argv, extra_env);
  return p.wait(timeout_s);
}

}  // namespace tandem::testing
