// The --hostfile head's background probes of the hosts an elastic job runs
// without (ssh_probe.h), against a fake `ssh` put first on PATH.

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "launch/launch_options.h"
#include "launch/ssh_probe.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {
namespace {

using testing::process_alive;
using testing::ScratchDir;
using testing::wait_for_exit;
using testing::wait_for_files;

// A fake `ssh`, first on PATH while it lives. `ssh ... HOST true` leaves an
// empty file probes/HOST.PID, then exits 0 if the test made HOST answer,
// blocks for good (on a FIFO no one opens) if it made HOST hang, else exits
// 255 as ssh does when it cannot connect.
class FakeSsh {
 public:
  FakeSsh() : old_path_(std::getenv("PATH") ? std::getenv("PATH") : "") {
    EXPECT_EQ(::mkdir(dir_.file("probes").c_str(), 0755), 0);
    EXPECT_EQ(::mkfifo(dir_.file("fifo").c_str(), 0600), 0);
    const std::string d = dir_.path();
    std::ofstream(dir_.file("ssh"))
        << "#!/bin/sh\n"
        << "for arg; do host=$last; last=$arg; done\n"  // the argument before `true`
        << ": > '" << d << "/probes/'\"$host.$$\"\n"
        << "[ -e '" << d << "/'\"$host.up\" ] && exit 0\n"
        << "[ -e '" << d << "/'\"$host.hangs\" ] && exec cat '" << d << "/fifo'\n"
        << "exit 255\n";
    EXPECT_EQ(::chmod(dir_.file("ssh").c_str(), 0755), 0);
    ::setenv("PATH", (d + ":" + old_path_).c_str(), 1);
  }
  ~FakeSsh() { ::setenv("PATH", old_path_.c_str(), 1); }

  void answer(const std::string& host) { std::ofstream(dir_.file(host + ".up")); }
  void hang(const std::string& host) { std::ofstream(dir_.file(host + ".hangs")); }

  // The pids of the probes run so far, once there are `n`; empty if there
  // are not within 30 s.
  std::vector<pid_t> wait_for_probes(size_t n) {
    const std::string probes = dir_.file("probes");
    if (!wait_for_files(probes, [&] { return probe_pids().size() >= n; }, 30)) return {};
    return probe_pids();
  }

 private:
  std::vector<pid_t> probe_pids() const {
    std::vector<pid_t> pids;
    std::error_code ec;
    for (const std::string& name : fs::list_directory(dir_.file("probes"), ec)) {
      pids.push_back(static_cast<pid_t>(std::atol(name.substr(name.rfind('.') + 1).c_str())));
    }
    return pids;
  }

  ScratchDir dir_;
  std::string old_path_;
};

// The value ssh would use for option `name`: the first one given.
std::string ssh_option(const std::vector<std::string>& argv, const std::string& name) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-o" && argv[i + 1].rfind(name + "=", 0) == 0) {
      return argv[i + 1].substr(name.size() + 1);
    }
  }
  return "";
}

TEST(SshArgv, TheJobsSshGivesUpOnAHostThatDropsItsPacketsIn10Seconds) {
  LaunchOptions opts;
  // Without ConnectTimeout, a host that drops SYNs takes the kernel's
  // retries, about 2 minutes, to be reported.
  EXPECT_EQ(ssh_option(ssh_argv(opts, "node2"), "ConnectTimeout"), "10");
  EXPECT_EQ(ssh_argv(opts, "node2").back(), "node2");
  // The user's own, in --launcher-args, comes first and so wins.
  opts.launcher_args = "-i key -o ConnectTimeout=30";
  EXPECT_EQ(ssh_option(ssh_argv(opts, "node2"), "ConnectTimeout"), "30");
}

TEST(RejoinProbe, NamesAHostOnlyOnceAProbeOfItAnswers) {
  FakeSsh ssh;
  RejoinProbe probe(LaunchOptions{}, {"node-a", "node-b"}, 0.0);
  EXPECT_EQ(probe.check(), "");  // starts a probe of each host
  const auto first = ssh.wait_for_probes(2);
  ASSERT_EQ(first.size(), 2u);
  for (pid_t pid : first) ASSERT_TRUE(wait_for_exit(pid, 30));
  ssh.answer("node-b");
  EXPECT_EQ(probe.check(), "") << "neither host answered the first probes";
  const auto both = ssh.wait_for_probes(4);
  ASSERT_EQ(both.size(), 4u) << "the next check probes both hosts again";
  for (pid_t pid : both) ASSERT_TRUE(wait_for_exit(pid, 30));
  EXPECT_EQ(probe.check(), "node-b");
}

TEST(RejoinProbe, WaitsForNoProbeAndKillsTheOnesStillRunningWhenDestroyed) {
  FakeSsh ssh;
  ssh.hang("node-c");
  pid_t hung = 0;
  {
    RejoinProbe probe(LaunchOptions{}, {"node-c"}, 0.0);
    EXPECT_EQ(probe.check(), "");
    const auto pids = ssh.wait_for_probes(1);
    ASSERT_EQ(pids.size(), 1u);
    hung = pids[0];
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(probe.check(), "") << "a probe still connecting has not answered";
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              1.0)
        << "check() waited for the probe";
    EXPECT_TRUE(process_alive(hung));
  }
  EXPECT_FALSE(process_alive(hung)) << "a probe outlived its RejoinProbe";
  if (process_alive(hung)) ::kill(hung, SIGKILL);
}

}  // namespace
}  // namespace tandem::cli
