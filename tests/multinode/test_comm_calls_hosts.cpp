// Subgroups, the mesh, point to point, all_to_all, gather and scatter across
// real hosts: each host a network namespace of a TestCluster, each rank a
// process of `tandem launch`. The worker (workers/comm_calls_worker.cpp)
// checks every result against a closed form; inside a host send/recv and the
// local group use shared memory, between hosts Gloo.

#include <gtest/gtest.h>

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

// Runs `nproc` comm_calls_worker ranks on each host; returns all output.
std::string run_comm_calls(TestCluster& cluster, int nproc, const std::string& port) {
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, 'c');
  const int nnodes = cluster.size();
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int node = 0; node < nnodes; ++node) {
    nodes.push_back(std::make_unique<BackgroundProcess>(
        cluster.on(node, {bin("tandem"), "launch", "--nnodes", std::to_string(nnodes),
                          "--node-rank", std::to_string(node), "--nproc-per-node",
                          std::to_string(nproc), "--master-addr", cluster.address(0),
                          "--master-port", port, bin("comm_calls_worker")}),
        std::vector<std::string>{token, "TANDEM_TIMEOUT_S=30"}));
  }
  std::string all;
  for (int node = 0; node < nnodes; ++node) {
    auto r = nodes[static_cast<std::size_t>(node)]->wait(90);
    EXPECT_EQ(r.exit_code, 0) << "host " << node << ": " << r.out << r.err;
    all += r.out + r.err;
  }
  return all;
}

void expect_every_rank_ok(const std::string& all, int world) {
  for (int rank = 0; rank < world; ++rank) {
    const std::string line = "rank " + std::to_string(rank) + "/" + std::to_string(world) +
                             " comm calls ok";
    EXPECT_NE(all.find(line), std::string::npos) << line << " missing in:\n" << all;
  }
}

TEST(MultiNodeCommCalls, TwoHostsOfTwoRanks) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  expect_every_rank_ok(run_comm_calls(cluster, 2, "29661"), 4);
}

TEST(MultiNodeCommCalls, ThreeHostsOfOneRank) {
  TestCluster cluster(3);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  expect_every_rank_ok(run_comm_calls(cluster, 1, "29663"), 3);
}

}  // namespace
}  // namespace tandem
