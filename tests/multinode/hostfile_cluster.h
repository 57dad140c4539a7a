#pragma once
// A TestCluster with an ssh server on every host and a DeepSpeed hostfile for
// it, for the `tandem launch --hostfile` tests (test_hostfile_job.cpp,
// test_hostfile_restarts.cpp).

#include <dirent.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/test_cluster.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::testing {

// A cluster of `hosts` with sshd on each, its hostfile (2 slots per host)
// in `dir`, and the ssh options the head needs for the cluster's keys.
struct SshCluster {
  explicit SshCluster(int hosts) : cluster(hosts) {
    if (!cluster.ok()) {
      why = cluster.why();
      return;
    }
    why = cluster.start_ssh();
    if (!why.empty()) return;
    hostfile = dir.path() + "/hosts";
    std::ofstream out(hostfile);
    out << "# the test cluster\n";
    for (int i = 0; i < hosts; ++i) out << cluster.address(i) << " slots=2\n";
  }

  // `tandem launch --hostfile` run on host 0.
  std::vector<std::string> head(int port, const std::vector<std::string>& program,
                                const std::string& ssh_options = "") const {
    return launch(port, {"--hostfile", hostfile}, program, ssh_options);
  }

  // `tandem launch FLAGS` run on host 0 with the ssh options the cluster
  // needs: a hostfile job whose hostfile `flags` give (a config file's).
  std::vector<std::string> launch(int port, const std::vector<std::string>& flags,
                                  const std::vector<std::string>& program,
                                  const std::string& ssh_options = "") const {
    std::vector<std::string> argv = {bin("tandem"), "launch"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--launcher-args",
        ssh_options + " -i " + cluster.ssh_dir() + "/client_key -l root -o "
            "StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o "
            "ConnectTimeout=5",
        "--master-port", std::to_string(port), "--grace-period", "2"});
    argv.insert(argv.end(), program.begin(), program.end());
    return cluster.on(0, argv);
  }

  // A fresh folder for the ranks' pid files (TANDEM_TEST_PID_DIR).
  std::string pid_dir() const {
    const std::string dir = this->dir.path() + "/pids";
    EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
    return dir;
  }

  // Processes left on the hosts other than their ssh servers.
  std::vector<pid_t> leftovers() const {
    std::vector<pid_t> out;
    for (int host = 0; host < cluster.size(); ++host) {
      for (pid_t pid : cluster.pids(host)) {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::string name;
        if (comm >> name && name != "sshd") out.push_back(pid);
      }
    }
    return out;
  }

  TestCluster cluster;
  TempDir dir;
  std::string why;
  std::string hostfile;
};

inline int count_files(const std::string& dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

inline double max_relative_diff(const std::string& a_path, const std::string& b_path) {
  SafetensorsReader a(a_path), b(b_path);
  EXPECT_EQ(a.entries().size(), b.entries().size());
  double worst = 0;
  for (const auto& entry : a.entries()) {
    const auto x = a.read(entry.name);
    const auto y = b.read(entry.name);
    const double scale = std::max(1e-6, y.abs().max().item<double>());
    worst = std::max(worst, (x - y).abs().max().item<double>() / scale);
  }
  return worst;
}

// Waits until `n` ranks have written their pid into `pids`.
inline bool wait_for_ranks(const std::string& pids, int n) {
  return wait_for_files(pids, [&] { return count_files(pids) == n; }, 120);
}

// Every rank of a world of `world` said launch_test_worker's "allreduce ok".
inline void expect_all_reduced(const std::string& out, int world) {
  const std::string sum = std::to_string(world * (world + 1) / 2);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_NE(out.find("rank " + std::to_string(rank) + "/" + std::to_string(world) +
                       " allreduce ok sum=" + sum),
              std::string::npos)
        << out;
  }
}

}  // namespace tandem::testing
