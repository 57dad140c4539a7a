// `tandem launch` end to end, with real processes.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <set>

#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::process_alive;
using testing::ProcessResult;
using testing::read_file;
using testing::run_process;
using testing::TempDir;
using testing::wait_for_exit;
using testing::wait_for_files;

std::vector<std::string> launch(std::vector<std::string> args) {
  args.insert(args.begin(), {bin("tandem"), "launch"});
  return args;
}

std::string worker() { return bin("launch_test_worker"); }

std::vector<pid_t> read_pids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::string text = read_file(dir + "/rank" + std::to_string(r) + ".pid");
    if (!text.empty()) pids.push_back(std::stoi(text));
  }
  return pids;
}

// Waits until all n workers have written their pid files.
std::vector<pid_t> wait_for_pids(const std::string& dir, int n) {
  wait_for_files(dir, [&] { return static_cast<int>(read_pids(dir, n).size()) == n; }, 20);
  auto pids = read_pids(dir, n);
  EXPECT_EQ(static_cast<int>(pids.size()), n) << "workers did not start";
  return pids;
}

bool none_alive(const std::vector<pid_t>& pids, double within_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(within_s);
  for (pid_t p : pids) {
    double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (!wait_for_exit(p, std::max(0.0, left))) return false;
  }
  return true;
}

TEST(Launch, PrintsEveryRankWithTheWorldSize) {
  auto r = run_process(launch({"--nproc-per-node", "4", "/bin/sh", "-c", "echo $RANK $WORLD_SIZE"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string line = "[rank" + std::to_string(rank) + "]: " + std::to_string(rank) + " 4\n";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

TEST(Launch, SetsTheTorchrunEnvironmentContract) {
  auto r = run_process(
      launch({"--nproc_per_node=2", "--no-prefix", "/bin/sh", "-c",
              "echo $RANK,$LOCAL_RANK,$WORLD_SIZE,$LOCAL_WORLD_SIZE,$GROUP_RANK,$MASTER_ADDR,"
              "$TORCHELASTIC_USE_AGENT_STORE,$TORCHELASTIC_RESTART_COUNT,$OMP_NUM_THREADS"}),
      30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0,0,2,2,0,127.0.0.1,True,0,1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1,1,2,2,0,127.0.0.1,True,0,1\n"), std::string::npos) << r.out;
}

TEST(Launch, FourRanksAllReduce) {
  auto r = run_process(launch({"--nproc-per-node", "4", "--standalone", worker(), "allreduce"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string line = "rank " + std::to_string(rank) + "/4 allreduce ok sum=10";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

TEST(Launch, FailingWorkerStopsTheJobAndIsNamed) {
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

TEST(Launch, FailureStopsTheOthersWithinFiveSeconds) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "3", worker(), "hang-nojoin"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 3);
  ASSERT_EQ(pids.size(), 3u);
  ::kill(pids[1], SIGKILL);
  auto r = p.wait(10);
  ASSERT_FALSE(r.timed_out);
  EXPECT_LT(r.seconds, 5.0 + 20.0);  // startup + the 5 s budget; tighter below
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("Root cause: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(pids, 0.5));
}

TEST(Launch, StopsWithinFiveSecondsOfTheFailure) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "2", worker(), "hang-nojoin"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  ASSERT_EQ(pids.size(), 2u);
  auto killed_at = std::chrono::steady_clock::now();
  ::kill(pids[0], SIGKILL);
  auto r = p.wait(10);
  double after_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(after_kill, 5.0);
  EXPECT_NE(r.exit_code, 0);
}

TEST(Launch, SigintIsForwardedAndNoWorkerSurvives) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "2", "--standalone", worker(), "hang"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  p.send(SIGINT);
  auto r = p.wait(10);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 130);
  EXPECT_NE(r.err.find("received SIGINT"), std::string::npos) << r.err;
  EXPECT_TRUE(none_alive(pids, 1.0));
}

TEST(Launch, SigtermIsForwardedAndNoWorkerSurvives) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "2", worker(), "hang-nojoin"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  p.send(SIGTERM);
  auto r = p.wait(10);
  EXPECT_EQ(r.exit_code, 143);
  EXPECT_TRUE(none_alive(pids, 1.0));
}

TEST(Launch, SigkillOfTheLauncherLeavesNoOrphans) {
  TempDir pid_dir;
  BackgroundProcess p(launch({"--nproc-per-node", "3", "--standalone", worker(), "hang"}),
                      {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 3);
  p.send(SIGKILL);
  p.wait(5);
  EXPECT_TRUE(none_alive(pids, 5.0)) << "a worker outlived its SIGKILLed launcher";
}

TEST(Launch, PortInUseIsAClearErrorWithinTwoSeconds) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string port = std::to_string(ntohs(addr.sin_port));

  auto r = run_process(launch({"--nproc-per-node", "2", "--master-port", port, worker(), "allreduce"}),
                       10);
  ::close(fd);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.seconds, 2.0);
  EXPECT_NE(r.err.find("port " + port), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
}

TEST(Launch, BadInputExitsWithCodeTwoAndSaysWhy) {
  auto missing = run_process(launch({"--nproc-per-node", "2"}), 10);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("missing PROGRAM"), std::string::npos) << missing.err;

  auto not_found = run_process(launch({"./no/such/program"}), 10);
  EXPECT_EQ(not_found.exit_code, 2);
  EXPECT_NE(not_found.err.find("'./no/such/program' was not found"), std::string::npos);

  auto bad_node = run_process(launch({"--nnodes", "2", "--node-rank", "2", "/bin/true"}), 10);
  EXPECT_EQ(bad_node.exit_code, 2);
  EXPECT_NE(bad_node.err.find("--node-rank 2"), std::string::npos) << bad_node.err;

  auto bad_flag = run_process(launch({"--nproc-per-node", "two", "/bin/true"}), 10);
  EXPECT_EQ(bad_flag.exit_code, 2);
}

TEST(Launch, IncludeFilterSetsVisibleDevicesAndProcessCount) {
  auto r = run_process(launch({"--include", "localhost:1,3", "--no-prefix", "/bin/sh", "-c",
                               "echo $LOCAL_RANK:$WORLD_SIZE:$CUDA_VISIBLE_DEVICES"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0:2:1,3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1:2:1,3\n"), std::string::npos) << r.out;

  auto ex = run_process(launch({"--nproc-per-node", "3", "--exclude", "localhost:1", "--no-prefix",
                                "/bin/sh", "-c", "echo $LOCAL_RANK:$CUDA_VISIBLE_DEVICES"}),
                        30);
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  EXPECT_NE(ex.out.find("1:0,2\n"), std::string::npos) << ex.out;
}

TEST(Launch, LogDirKeepsEachRanksStreams) {
  TempDir logs;
  auto r = run_process(launch({"--nproc-per-node", "2", "--log-dir", logs.path(), "/bin/sh", "-c",
                               "echo out$RANK; echo err$RANK >&2"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(logs.path() + "/attempt_0/rank_1/stdout.log"), "out1\n");
  EXPECT_EQ(read_file(logs.path() + "/attempt_0/rank_1/stderr.log"), "err1\n");
  EXPECT_NE(r.out.find("[rank0]: out0"), std::string::npos) << "--log-dir alone also tees";

  TempDir quiet;
  auto q = run_process(launch({"--nproc-per-node", "1", "--log-dir", quiet.path(), "--redirects",
                               "3", "/bin/sh", "-c", "echo hidden"}),
                       30);
  EXPECT_EQ(q.out.find("hidden"), std::string::npos);
  EXPECT_EQ(read_file(quiet.path() + "/attempt_0/rank_0/stdout.log"), "hidden\n");
}

}  // namespace
}  // namespace tandem
