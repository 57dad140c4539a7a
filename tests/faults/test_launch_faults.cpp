// The launcher under faults, with real processes: a worker killed, throwing
// or exiting; signals to the launcher; a busy port; the restart budget.
// Every scenario checks the launcher's exit code and message, and that no
// process of the job survives.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <fstream>

#include "support/launch_testing.h"
#include "tandem/comm/shm_cleanup.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::launch;
using testing::none_alive;
using testing::read_pids;
using testing::run_process;
using testing::TempDir;
using testing::wait_for_pids;

std::string worker() { return bin("launch_test_worker"); }

TEST(LaunchFaults, FailingWorkerStopsTheJobAndIsNamed) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "3", "--standalone", worker(), "exit", "3", "1"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto r = p.wait(30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("Root cause: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  auto pids = read_pids(pid_dir.path(), 3);
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_TRUE(none_alive(pids, 1.0));
}

TEST(LaunchFaults, FailureStopsTheOthersWithinFiveSeconds) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "3", worker(), "hang-nojoin"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 3);
  ASSERT_EQ(pids.size(), 3u) << "workers did not start";
  ::kill(pids[1], SIGKILL);
  auto r = p.wait(10);
  ASSERT_FALSE(r.timed_out);
  EXPECT_LT(r.seconds, 5.0 + 20.0);  // startup + the 5 s budget; tighter below
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("Root cause: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(pids, 0.5));
}

TEST(LaunchFaults, StopsWithinFiveSecondsOfTheFailure) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "2", worker(), "hang-nojoin"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  ASSERT_EQ(pids.size(), 2u) << "workers did not start";
  auto killed_at = std::chrono::steady_clock::now();
  ::kill(pids[0], SIGKILL);
  auto r = p.wait(10);
  double after_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(after_kill, 5.0);
  EXPECT_NE(r.exit_code, 0);
}

TEST(LaunchFaults, SigintIsForwardedAndNoWorkerSurvives) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "2", "--standalone", worker(), "hang"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  ASSERT_EQ(pids.size(), 2u) << "workers did not start";
  p.send(SIGINT);
  auto r = p.wait(10);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 130);
  EXPECT_NE(r.err.find("received SIGINT"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(pids, 1.0));
}

TEST(LaunchFaults, SigtermIsForwardedAndNoWorkerSurvives) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "2", worker(), "hang-nojoin"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  ASSERT_EQ(pids.size(), 2u) << "workers did not start";
  p.send(SIGTERM);
  auto r = p.wait(10);
  EXPECT_EQ(r.exit_code, 143);
  EXPECT_TRUE(none_alive(pids, 1.0));
}

TEST(LaunchFaults, SigkillOfTheLauncherLeavesNoOrphans) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "3", "--standalone", worker(), "hang"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 3);
  ASSERT_EQ(pids.size(), 3u) << "workers did not start";
  p.send(SIGKILL);
  p.wait(5);
  EXPECT_TRUE(none_alive(pids, 5.0)) << "a worker outlived its SIGKILLed launcher";
  // What the killed launcher could not do, the test does: remove the
  // shared-memory name rank 0 may have made before the others mapped it
  // (tandem's own sweep takes such names only after 10 minutes).
  for (const auto pid : pids) remove_shared_memory_of(static_cast<int>(pid));
}

// A shell-script worker whose rank starts a child that ignores SIGTERM,
// SIGINT and SIGHUP (as a backgrounded command can), writes both pids, and
// then, once every rank's child runs: rank FAILING exits 3; the others wait.
std::string worker_with_stubborn_child(const TempDir& dir, int failing) {
  const std::string path = dir.path() + "/stubborn_worker.sh";
  std::ofstream(path) << "#!/bin/sh\n"
                         "D=\"$TANDEM_TEST_PID_DIR\"\n"
                         "sh -c 'trap \"\" TERM INT HUP; echo $$ > \"$0/child$1.pid.tmp\"; "
                         "mv \"$0/child$1.pid.tmp\" \"$0/child$1.pid\"; exec sleep 300' \"$D\" "
                         "\"$RANK\" &\n"
                         // Every rank's child runs before any rank goes on.
                         "while [ \"$(ls \"$D\" | grep -c '^child[0-9]*\\.pid$')\" -lt "
                         "\"$WORLD_SIZE\" ]; do sleep 0.05; done\n"
                         "echo $$ > \"$D/rank$RANK.pid\"\n"
                         "if [ \"$RANK\" = "
                      << failing
                      << " ]; then exit 3; fi\n"
                         "wait\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

std::vector<pid_t> child_pids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const std::string text = testing::read_file(dir + "/child" + std::to_string(r) + ".pid");
    if (!text.empty()) pids.push_back(std::stoi(text));
  }
  return pids;
}

TEST(LaunchFaults, AFailedWorkersOwnChildrenDoNotOutliveTheJob) {
  TempDir pid_dir, scripts;
  BackgroundProcess p(launch({"--nproc-per-node", "2", "--grace-period", "1",
                              worker_with_stubborn_child(scripts, 1)}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto r = p.wait(30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  const auto children = child_pids(pid_dir.path(), 2);
  ASSERT_EQ(children.size(), 2u) << r.err;
  // Once the launcher has exited, nothing of the job is left: not the
  // failed rank's child, nor the child of the rank that was stopped.
  EXPECT_TRUE(none_alive(children, 0.5)) << "a worker's child outlived the job";
  for (pid_t pid : children) ::kill(pid, SIGKILL);  // the test's own cleanup, by pid
}

TEST(LaunchFaults, SigquitStopsTheWorkersAndTheirChildren) {
  TempDir pid_dir, scripts;
  BackgroundProcess p(launch({"--nproc-per-node", "2", "--grace-period", "1",
                              worker_with_stubborn_child(scripts, -1)}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  ASSERT_EQ(pids.size(), 2u) << "workers did not start";
  const auto children = child_pids(pid_dir.path(), 2);
  p.send(SIGQUIT);
  auto r = p.wait(30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGQUIT);
  EXPECT_NE(r.err.find("received SIGQUIT"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(pids, 0.5));
  EXPECT_TRUE(none_alive(children, 0.5)) << "a worker's child outlived the job";
  for (pid_t pid : children) ::kill(pid, SIGKILL);
}

TEST(LaunchFaults, PortInUseIsAClearErrorWithinTwoSeconds) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string port = std::to_string(ntohs(addr.sin_port));

  // Two seconds beyond the launcher's own start: loading LibTorch alone can
  // take longer than that on a loaded machine (ctest -j), so time a run of
  // the same program that does nothing else.
  const auto start_only = run_process({bin("tandem"), "--version"}, 60);
  ASSERT_EQ(start_only.exit_code, 0) << start_only.err;
  auto r = run_process(launch({"--nproc-per-node", "2", "--master-port", port, worker(), "allreduce"}),
                       start_only.seconds + 30);
  ::close(fd);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.seconds, start_only.seconds + 2.0);
  EXPECT_NE(r.err.find("port " + port), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
}

TEST(LaunchFaults, UncaughtExceptionIsTheRootCauseWithItsMessage) {
  TempDir pid_dir;
  auto r = run_process(launch({"--nproc-per-node", "2", bin("fault_worker"), "--throw-at", "3"}),
                       60, {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("Root cause: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("std::runtime_error: injected failure at step 3"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("signal 6 (SIGABRT)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Other workers:\n  rank 0"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(read_pids(pid_dir.path(), 2), 1.0));
}

TEST(LaunchFaults, ErrorFilesAreKeptInTheLogDirectory) {
  TempDir logs;
  auto r = run_process(launch({"--nproc-per-node", "2", "--log-dir", logs.path(),
                               bin("fault_worker"), "--throw-at", "2", "--rank", "0"}),
                       60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string file = logs.path() + "/attempt_0/rank_0/error.json";
  const std::string json = testing::read_file(file);
  EXPECT_NE(json.find("\"rank\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"message\":\"injected failure at step 2\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"pid\":"), std::string::npos) << json;
  EXPECT_NE(json.find("\"time\":"), std::string::npos) << json;
  EXPECT_NE(r.err.find("error file: " + file), std::string::npos) << r.err;
}

TEST(LaunchFaults, RestartsTheGroupWithTheRestartCountAndThenSucceeds) {
  auto r = run_process(
      launch({"--nproc-per-node", "2", "--max-restarts", "2", "/bin/sh", "-c",
              "echo attempt=$TANDEM_RESTART_COUNT,$TORCHELASTIC_RESTART_COUNT; "
              "test $TANDEM_RESTART_COUNT -ge 1 || exit 5"}),
      60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Attempt 0's first failure stops the other rank, maybe before it prints.
  EXPECT_NE(r.out.find("attempt=0,0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank0]: attempt=1,1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank1]: attempt=1,1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("attempt=2"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("attempt 0 failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting all 2 workers (restart 1 of 2)"), std::string::npos) << r.err;
}

TEST(LaunchFaults, RestartBudgetExhaustedExitsNonZeroAndNoWorkerSurvives) {
  TempDir pid_dir;
  auto r = run_process(launch({"--nproc-per-node", "2", "--max-restarts", "2",
                               bin("fault_worker"), "--throw-at", "2"}),
                       120, {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("attempt 0 failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("attempt 1 failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restart budget is exhausted (--max-restarts 2, attempts 0 to 2 all "
                       "failed)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("injected failure at step 2"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(read_pids(pid_dir.path(), 2), 1.0));
}

}  // namespace
}  // namespace tandem
