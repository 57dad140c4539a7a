// Multi-node launches that need no cluster, and foreign launchers (mpirun
// stands in for them). The runs across hosts are in tests/multinode.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "support/reserved_port.h"
#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::run_process;

bool sh(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

TEST(MultiNode, LaunchWithoutAStoreTokenStopsBeforeAnyWorkerAndSaysHowToMakeOne) {
  ::unsetenv("TANDEM_STORE_TOKEN");  // the launcher inherits this process's environment
  auto r = run_process({bin("tandem"), "launch", "--nnodes", "2", "--node-rank", "1",
                        "--nproc-per-node", "1", "--master-addr", "10.231.7.1", "--master-port",
                        "29633", bin("launch_test_worker"), "allreduce"},
                       20);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("needs TANDEM_STORE_TOKEN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("head -c 32 /dev/urandom"), std::string::npos) << r.err;
}

// Two launchers on this machine stand in for two nodes over loopback.
std::vector<std::string> static_node(int port, int node, const std::string& processes) {
  return {bin("tandem"), "launch", "--nnodes", "2", "--machine_rank", std::to_string(node),
          "--num_processes", processes, "--master-addr", "127.0.0.1", "--master-port",
          std::to_string(port), bin("launch_test_worker"), "allreduce"};
}

TEST(MultiNode, StaticNodesWithDifferentProcessCountsAreRefusedAtOnceOnEveryNode) {
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  // accelerate's --num_processes counts every node's: 4 over 2 nodes is 2
  // on node 0, 2 over 2 is 1 on node 1. Without the check, ranks 1 of both
  // nodes met under one rank, and the job hung until its timeout.
  const std::vector<std::string> env = {"TANDEM_STORE_TOKEN=" + std::string(64, 'm')};
  BackgroundProcess node0(static_node(reserved.port(), 0, "4"), env);
  BackgroundProcess node1(static_node(reserved.port(), 1, "2"), env);
  auto r0 = node0.wait(60);
  auto r1 = node1.wait(60);
  for (const auto* r : {&r0, &r1}) {
    EXPECT_EQ(r->exit_code, 2) << r->out << r->err;
    EXPECT_NE(r->err.find("the 2 nodes disagree on the job's size: 3 process(es) in all, but "
                          "node 0"),
              std::string::npos)
        << r->err;
    EXPECT_NE(r->err.find("runs 2 of a world of 4"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("runs 1 of a world of 2"), std::string::npos) << r->err;
    EXPECT_NE(r->err.find("give each the same --nproc-per-node"), std::string::npos) << r->err;
    EXPECT_EQ(r->out.find("allreduce"), std::string::npos) << "a worker ran: " << r->out;
    EXPECT_LT(r->seconds, 30) << "refused late";
  }
  EXPECT_NE(r0.err.find("node 0 (this node) runs 2"), std::string::npos) << r0.err;
  EXPECT_NE(r1.err.find("node 1 (this node) runs 1"), std::string::npos) << r1.err;
}

TEST(MultiNode, StaticNodesWithTheSameProcessCountRunTheJob) {
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  const std::vector<std::string> env = {"TANDEM_STORE_TOKEN=" + std::string(64, 'm')};
  BackgroundProcess node0(static_node(reserved.port(), 0, "4"), env);
  BackgroundProcess node1(static_node(reserved.port(), 1, "4"), env);
  auto r0 = node0.wait(120);
  auto r1 = node1.wait(120);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE((r0.out + r1.out).find("rank " + std::to_string(rank) + "/4 allreduce ok sum=10"),
              std::string::npos)
        << r0.out << r1.out;
  }
}

TEST(MultiNode, Node0WithoutAnAddressIsRefusedAtOnceInsteadOfHidingTheStoreOnLoopback) {
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  // No --master-addr: the store would listen on 127.0.0.1, and node 1 on
  // another machine would wait for it until its timeout.
  auto r = run_process({bin("tandem"), "launch", "--nnodes", "2", "--node-rank", "0",
                        "--master-port", std::to_string(reserved.port()),
                        bin("launch_test_worker"), "allreduce"},
                       30, {"TANDEM_STORE_TOKEN=" + std::string(64, 'm')});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("a launch across 2 nodes needs node 0's network address for its "
                       "rendezvous store: give --master-addr"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds, 10);
}

// A store port in use: a multi-node job cannot take a free port, so the
// advice is the flag that chose it, the same on every node.
TEST(MultiNode, APortInUseOnNode0NamesTheFlagThatChoseIt) {
  testing::ReservedPort taken(/*shareable=*/false);
  ASSERT_NE(taken.port(), 0);
  const std::string port = std::to_string(taken.port());
  const std::vector<std::string> env = {"TANDEM_STORE_TOKEN=" + std::string(64, 'm')};
  auto fixed = run_process({bin("tandem"), "launch", "--nnodes", "2", "--node-rank", "0",
                            "--master-addr", "127.0.0.1", "--master-port", port,
                            bin("launch_test_worker"), "allreduce"},
                           30, env);
  EXPECT_EQ(fixed.exit_code, 1) << fixed.err;
  EXPECT_NE(fixed.err.find("the port is already in use, probably by another job; pick another "
                           "with --master-port (main_process_port), the same on every node"),
            std::string::npos)
      << fixed.err;
  EXPECT_EQ(fixed.err.find("--standalone"), std::string::npos) << fixed.err;
  auto c10d = run_process({bin("tandem"), "launch", "--nnodes", "2", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", "127.0.0.1:" + port, bin("launch_test_worker"),
                           "allreduce"},
                          30, env);
  EXPECT_EQ(c10d.exit_code, 1) << c10d.err;
  EXPECT_NE(c10d.err.find("pick another port in --rdzv-endpoint HOST:PORT, the same on every "
                          "node"),
            std::string::npos)
      << c10d.err;
  EXPECT_EQ(c10d.err.find("--standalone"), std::string::npos) << c10d.err;
}

TEST(ForeignLauncher, MpirunStartsAWorkingJob) {
  if (!sh("command -v mpirun")) GTEST_SKIP() << "skipped: mpirun (openmpi-bin) is not installed";
  // Rank 0 hosts the store on MASTER_PORT: a port held free for this test,
  // not a fixed number another job on the machine might be using.
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  auto r = run_process({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                        "MASTER_ADDR=127.0.0.1", "-x",
                        "MASTER_PORT=" + std::to_string(reserved.port()),
                        bin("launch_test_worker"), "allreduce"},
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0/2 allreduce ok sum=3 source=openmpi"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1/2 allreduce ok sum=3 source=openmpi"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem
