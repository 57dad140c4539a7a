// Hierarchical collectives across real hosts: each host a network namespace
// of a TestCluster, each rank a process of `tandem launch`. The worker
// checks all_reduce, reduce_scatter and all_gather against closed forms and
// which path its world group took.

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

// Runs `nproc` workers on each of the cluster's hosts expecting `form`, and
// returns every host's output (exit codes checked).
std::string run_job(TestCluster& cluster, int nproc, const std::string& form,
                    const std::string& port) {
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, 'h');
  const int nnodes = cluster.size();
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int node = 0; node < nnodes; ++node) {
    nodes.push_back(std::make_unique<BackgroundProcess>(
        cluster.on(node, {bin("tandem"), "launch", "--nnodes", std::to_string(nnodes),
                          "--node-rank", std::to_string(node), "--nproc-per-node",
                          std::to_string(nproc), "--master-addr", cluster.address(0),
                          "--master-port", port, bin("hierarchical_test_worker"), form}),
        std::vector<std::string>{token, "TANDEM_TIMEOUT_S=20"}));
  }
  std::string all;
  for (int node = 0; node < nnodes; ++node) {
    auto r = nodes[static_cast<std::size_t>(node)]->wait(60);
    EXPECT_EQ(r.exit_code, 0) << "host " << node << ": " << r.out << r.err;
    all += r.out + r.err;
  }
  return all;
}

TEST(MultiNodeHierarchical, TwoHostsOfTwoRanksReduceInsideEachHostFirst) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string all = run_job(cluster, 2, "split", "29651");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(all.find("rank " + std::to_string(rank) + "/4 hierarchical=split checks ok"),
              std::string::npos)
        << all;
  }
}

TEST(MultiNodeHierarchical, ThreeHostsOfOneRankStayOnTheFlatPath) {
  TestCluster cluster(3);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string all = run_job(cluster, 1, "none", "29653");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(all.find("rank " + std::to_string(rank) + "/3 hierarchical=none checks ok"),
              std::string::npos)
        << all;
  }
}

}  // namespace
}  // namespace tandem
