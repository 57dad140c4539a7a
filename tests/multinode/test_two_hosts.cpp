// Launches across hosts: each host a network namespace of a TestCluster.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/test_cluster.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::TestCluster;

// One node's `tandem launch` of launch_test_worker's all-reduce.
std::vector<std::string> node_command(int node_rank, int nnodes, int nproc,
                                      const std::string& master, const std::string& port) {
  return {bin("tandem"),     "launch",
          "--nnodes",        std::to_string(nnodes),
          "--node-rank",     std::to_string(node_rank),
          "--nproc-per-node", std::to_string(nproc),
          "--master-addr",   master,
          "--master-port",   port,
          bin("launch_test_worker"), "allreduce"};
}

TEST(MultiNode, TwoHostsFormOneWorldOfFour) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, '7');
  BackgroundProcess node0(cluster.on(0, node_command(0, 2, 2, cluster.address(0), "29631")),
                          {token});
  BackgroundProcess node1(cluster.on(1, node_command(1, 2, 2, cluster.address(0), "29631")),
                          {token});
  auto r0 = node0.wait(60);
  auto r1 = node1.wait(60);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_NE(r0.out.find("[rank1]: rank 1/4 allreduce ok sum=10"), std::string::npos) << r0.out;
  EXPECT_NE(r1.out.find("[rank2]: rank 2/4 allreduce ok sum=10"), std::string::npos) << r1.out;
  EXPECT_NE(r1.out.find("[rank3]: rank 3/4 allreduce ok sum=10"), std::string::npos) << r1.out;
}

TEST(MultiNode, ThreeHostsFormOneWorldOfThree) {
  TestCluster cluster(3);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, '3');
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int node = 0; node < 3; ++node) {
    nodes.push_back(std::make_unique<BackgroundProcess>(
        cluster.on(node, node_command(node, 3, 1, cluster.address(0), "29637")),
        std::vector<std::string>{token}));
  }
  for (int node = 0; node < 3; ++node) {
    auto r = nodes[node]->wait(60);
    ASSERT_EQ(r.exit_code, 0) << "host " << node << ": " << r.out << r.err;
    // 0 + 1 + 2 + 3 ranks' values 1..3 summed: every host sees the same sum.
    EXPECT_NE(r.out.find("rank " + std::to_string(node) + "/3 allreduce ok sum=6"),
              std::string::npos)
        << r.out;
  }
}

TEST(MultiNode, AnIncludeAcrossHostsSizesTheWorldBySelectedSlots) {
  // DeepSpeed's `--include host1:0,1@host2:0`: two processes on the first
  // host, one on the second, WORLD_SIZE=3; the filter's order numbers the
  // nodes, so no --node-rank.
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string include = cluster.address(0) + ":0,1@" + cluster.address(1) + ":0";
  auto node = [&] {
    return std::vector<std::string>{bin("tandem"),     "launch",  "--nnodes",
                                    "2",               "--include", include,
                                    "--nproc-per-node", "2",      "--master-addr",
                                    cluster.address(0), "--master-port", "29639",
                                    bin("launch_test_worker"), "allreduce"};
  };
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, '5');
  BackgroundProcess node0(cluster.on(0, node()), {token});
  BackgroundProcess node1(cluster.on(1, node()), {token});
  auto r0 = node0.wait(60);
  auto r1 = node1.wait(60);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  // Ranks 0..2 all-reduce rank+1: 1 + 2 + 3.
  EXPECT_NE(r0.out.find("rank 0/3 allreduce ok sum=6"), std::string::npos) << r0.out;
  EXPECT_NE(r0.out.find("rank 1/3 allreduce ok sum=6"), std::string::npos) << r0.out;
  EXPECT_NE(r1.out.find("rank 2/3 allreduce ok sum=6"), std::string::npos) << r1.out;
  EXPECT_EQ(r1.out.find("rank 3/"), std::string::npos) << "one process on the second host";
}

TEST(MultiNode, ThreeHostsAgreeOnNodeRanksAtTheStoreWithoutNodeRankFlags) {
  // torchrun's `--rdzv-backend c10d`: the host the endpoint names is node 0,
  // the others number themselves as they arrive; nodes may run different
  // numbers of processes (2 + 1 + 1 here).
  TestCluster cluster(3);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, '9');
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int host : {2, 1, 0}) {  // the store's host last: the others wait for it
    nodes.push_back(std::make_unique<BackgroundProcess>(
        cluster.on(host, {bin("tandem"), "launch", "--nnodes", "3", "--nproc-per-node",
                          host == 0 ? "2" : "1", "--rdzv-backend", "c10d", "--rdzv-id", "job9",
                          "--rdzv-endpoint", cluster.address(0) + ":29641",
                          bin("launch_test_worker"), "allreduce"}),
        std::vector<std::string>{token}));
  }
  std::string all;
  for (auto& node : nodes) {
    auto r = node->wait(90);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    all += r.out + r.err;
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(all.find("rank " + std::to_string(rank) + "/4 allreduce ok sum=10"),
              std::string::npos)
        << all;
  }
  EXPECT_NE(all.find("rendezvous 'job9': this node is node 0 of 3 (2 of 4 processes)"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("this node is node 1 of 3 (1 of 4 processes)"), std::string::npos) << all;
  EXPECT_NE(all.find("this node is node 2 of 3 (1 of 4 processes)"), std::string::npos) << all;
}

TEST(MultiNode, AnIPv6EndpointIsHostedByTheNodeWithThatAddress) {
  // `--rdzv-endpoint [fd00:231::1]:PORT`: host 0 has that address, so it
  // hosts the store and is node 0.
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  for (int host = 0; host < 2; ++host) {
    ASSERT_EQ(std::system(("ip -n " + cluster.name(host) + " addr add fd00:231::" +
                           std::to_string(host + 1) + "/64 dev eth0 nodad")
                              .c_str()),
              0);
  }
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, '6');
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int host : {1, 0}) {
    nodes.push_back(std::make_unique<BackgroundProcess>(
        cluster.on(host, {bin("tandem"), "launch", "--nnodes", "2", "--nproc-per-node", "1",
                          "--rdzv-backend", "c10d", "--rdzv-endpoint", "[fd00:231::1]:29643",
                          "--rdzv-timeout", "30", bin("launch_test_worker"), "allreduce"}),
        std::vector<std::string>{token, "TANDEM_TIMEOUT_S=30"}));
  }
  std::string all;
  for (auto& node : nodes) {
    auto r = node->wait(60);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    all += r.out + r.err;
  }
  EXPECT_NE(all.find("rank 0/2 allreduce ok sum=3"), std::string::npos) << all;
  EXPECT_NE(all.find("rank 1/2 allreduce ok sum=3"), std::string::npos) << all;
  EXPECT_NE(all.find("this node is node 0 of 2"), std::string::npos) << all;
}

TEST(MultiNode, Node0WhoseNameResolvesToLoopbackIsRefusedAtOnceWithTheFix) {
  // Debian's /etc/hosts maps the machine's own name to 127.0.1.1: the store
  // would listen there, where no other node reaches it.
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  ASSERT_TRUE(cluster.set_host_names({"node0", "node1"}));
  std::ofstream("/etc/netns/" + cluster.name(0) + "/hosts")
      << "127.0.0.1 localhost\n127.0.1.1 node0\n" << cluster.address(1) << " node1\n";
  auto r = testing::run_process(cluster.on(0, node_command(0, 2, 1, "node0", "29645")), 30,
                                {"TANDEM_STORE_TOKEN=" + std::string(64, '5')});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("the rendezvous store's address node0 (127.0.1.1 on this machine) is a "
                       "loopback address on node 0"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Give node 0's network address: --master-addr / main_process_ip"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("fix /etc/hosts"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("allreduce"), std::string::npos) << "a worker ran: " << r.out;
  EXPECT_LT(r.seconds, 10) << "refused late";
}

TEST(MultiNode, ANodeWithTheWrongTokenIsRefusedWithTheFix) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  BackgroundProcess node0(cluster.on(0, node_command(0, 2, 1, cluster.address(0), "29635")),
                          {"TANDEM_STORE_TOKEN=" + std::string(64, 'a')});
  BackgroundProcess node1(cluster.on(1, node_command(1, 2, 1, cluster.address(0), "29635")),
                          {"TANDEM_STORE_TOKEN=" + std::string(64, 'b')});
  auto r1 = node1.wait(60);
  EXPECT_EQ(r1.exit_code, 1) << r1.out << r1.err;
  const std::string all = r1.out + r1.err;
  EXPECT_NE(all.find("token did not match"), std::string::npos) << all;
  EXPECT_NE(all.find("TANDEM_STORE_TOKEN must be the same on every node"), std::string::npos)
      << all;
  node0.send(SIGTERM);  // its rank 0 waits for the refused rank
  node0.wait(20);
}

}  // namespace
}  // namespace tandem
