// Multi-node launches that need no cluster, and foreign launchers (mpirun
// stands in for them). The runs across hosts are in tests/multinode.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
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

// Node 1 told --master-addr 127.0.0.1 while node 0 runs on another machine
// waits for a store that is not there: it says so while it waits, and its
// timeout names the loopback address as the likely cause.
TEST(MultiNode, ANodeWaitingForAStoreOnLoopbackSaysSoAndWhy) {
  testing::ReservedPort reserved(/*shareable=*/false);
  ASSERT_NE(reserved.port(), 0);
  auto r = run_process({bin("tandem"), "launch", "--nnodes", "2", "--node-rank", "1",
                        "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                        std::to_string(reserved.port()), bin("launch_test_worker"), "allreduce"},
                       60, {"TANDEM_STORE_TOKEN=" + std::string(64, 'w'), "TANDEM_TIMEOUT_S=13"});
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("still waiting for the rendezvous store at 127.0.0.1:" +
                       std::to_string(reserved.port()) + " after 1"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("could not reach the rendezvous store"), std::string::npos) << r.err;
  const std::string hint = "127.0.0.1 is a loopback address: it reaches a store on this machine";
  const std::size_t first = r.err.find(hint);
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_NE(r.err.find(hint, first + 1), std::string::npos) << "in the notice and the error: "
                                                            << r.err;
  EXPECT_LT(r.seconds, 30);
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
  // The c10d node only inferred it hosts the store: it tries the port as a
  // client first (another node of this machine may host it), briefly.
  EXPECT_EQ(c10d.exit_code, 1) << c10d.err;
  EXPECT_NE(c10d.err.find("the port is already in use, and no store of this job answers there"),
            std::string::npos)
      << c10d.err;
  EXPECT_NE(c10d.err.find("pick another port in --rdzv-endpoint HOST:PORT, the same on every "
                          "node"),
            std::string::npos)
      << c10d.err;
  EXPECT_EQ(c10d.err.find("--standalone"), std::string::npos) << c10d.err;
}

// `tandem launch --rdzv-backend c10d` without --node-rank, as one node of
// a job whose store is on this machine.
std::vector<std::string> c10d_node(int port, const std::string& processes,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {bin("tandem"), "launch", "--nnodes", "2", "--nproc-per-node",
                                   processes, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port), "--rdzv-id", "onebox",
                                   "--rdzv-timeout", "60"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.insert(argv.end(), {bin("launch_test_worker"), "allreduce"});
  return argv;
}

// Both nodes take themselves for the endpoint's host (it is this machine):
// the one that binds the port hosts the store, the other joins it, as
// torchrun's nodes do.
TEST(MultiNode, TwoC10dNodesOnOneMachineFormOneJob) {
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  const std::vector<std::string> env = {"TANDEM_STORE_TOKEN=" + std::string(64, 'c')};
  BackgroundProcess a(c10d_node(reserved.port(), "2"), env);
  BackgroundProcess b(c10d_node(reserved.port(), "1"), env);
  auto ra = a.wait(120);
  auto rb = b.wait(120);
  ASSERT_EQ(ra.exit_code, 0) << ra.out << ra.err;
  ASSERT_EQ(rb.exit_code, 0) << rb.out << rb.err;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE((ra.out + rb.out).find("rank " + std::to_string(rank) + "/3 allreduce ok sum=6"),
              std::string::npos)
        << ra.out << rb.out;
  }
  EXPECT_NE((ra.err + rb.err).find("joining it as a client"), std::string::npos)
      << ra.err << rb.err;
}

// --rdzv-conf is_host=true: this node hosts the store or fails; no
// fallback to a store already there.
TEST(MultiNode, AC10dNodeToldToHostTheStoreFailsOnAPortInUse) {
  testing::ReservedPort taken(/*shareable=*/false);
  ASSERT_NE(taken.port(), 0);
  auto r = run_process(c10d_node(taken.port(), "1", {"--rdzv-conf", "is_host=true"}), 30,
                       {"TANDEM_STORE_TOKEN=" + std::string(64, 'c')});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("the port is already in use, probably by another job"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("joining it as a client"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10);
}

// A c10d node waiting for the others stops on SIGINT or SIGTERM as a
// running one does: at once, with a message, exit 128+signal; also when
// SIGINT came ignored (a script's `cmd &`).
void expect_waiting_node_stops_on(int sig, bool sigint_ignored) {
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  struct sigaction ignore {}, saved {};
  ignore.sa_handler = SIG_IGN;
  if (sigint_ignored) ::sigaction(SIGINT, &ignore, &saved);
  BackgroundProcess node(c10d_node(reserved.port(), "1"),
                         {"TANDEM_STORE_TOKEN=" + std::string(64, 'c')});
  if (sigint_ignored) ::sigaction(SIGINT, &saved, nullptr);
  // The loopback note comes once the node hosts its store and waits.
  const std::string dir = node.err_path().substr(0, node.err_path().rfind('/'));
  ASSERT_TRUE(testing::wait_for_files(
      dir,
      [&] {
        return testing::read_file(node.err_path()).find("a loopback address") !=
               std::string::npos;
      },
      30))
      << testing::read_file(node.err_path());
  node.send(sig);
  auto r = node.wait(10);
  ASSERT_FALSE(r.timed_out) << "still waiting at the rendezvous: " << r.err;
  EXPECT_EQ(r.signal, 0) << "killed by the signal's default action";
  EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
  EXPECT_NE(r.err.find(std::string("received SIG") + sigabbrev_np(sig) +
                       " while waiting at rendezvous 'onebox'"),
            std::string::npos)
      << r.err;
}

TEST(MultiNode, AC10dNodeWaitingForTheOthersStopsOnSigterm) {
  expect_waiting_node_stops_on(SIGTERM, false);
}

TEST(MultiNode, AC10dNodeWaitingForTheOthersStopsOnSigintEvenWhenItCameIgnored) {
  expect_waiting_node_stops_on(SIGINT, true);
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
