#pragma once
// Helpers for tests that run jobs through `tandem launch`: the command line,
// the workers' pid files (TANDEM_TEST_PID_DIR), and checks that no worker
// outlives its job.

#include <sys/stat.h>

#include <string>
#include <vector>

#include "support/subprocess.h"

namespace tandem::testing {

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// `tandem launch ARGS`. Unless ARGS pick the rendezvous port themselves,
// the launcher's store gets a free one (--master-port 0): every launch hosts
// a store, and on the default 29500 two tests run in parallel (ctest -j), or
// any other job on the machine, would collide.
inline std::vector<std::string> launch(std::vector<std::string> args) {
  bool port_chosen = false;
  for (const auto& arg : args) {
    for (const char* flag : {"--master-port", "--master_port", "--standalone", "--nnodes",
                             "--rdzv-endpoint", "--rdzv_endpoint"}) {
      if (arg.rfind(flag, 0) == 0) port_chosen = true;
    }
  }
  if (!port_chosen) args.insert(args.begin(), {std::string("--master-port"), "0"});
  args.insert(args.begin(), {bin("tandem"), "launch"});
  return args;
}

// Pids from DIR/rank<R>.pid for ranks 0..n-1; ranks without a file are left out.
inline std::vector<pid_t> read_pids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::string text = read_file(dir + "/rank" + std::to_string(r) + ".pid");
    if (!text.empty()) pids.push_back(std::stoi(text));
  }
  return pids;
}

// Waits until all n workers have written their pid files; empty on timeout.
inline std::vector<pid_t> wait_for_pids(const std::string& dir, int n, double timeout_s = 30) {
  wait_for_files(dir, [&] { return static_cast<int>(read_pids(dir, n).size()) == n; }, timeout_s);
  auto pids = read_pids(dir, n);
  if (static_cast<int>(pids.size()) != n) pids.clear();
  return pids;
}

// True when every pid has exited (or was never alive) within `within_s`.
inline bool none_alive(const std::vector<pid_t>& pids, double within_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(within_s);
  for (pid_t p : pids) {
    double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (!wait_for_exit(p, std::max(0.0, left))) return false;
  }
  return true;
}

}  // namespace tandem::testing
