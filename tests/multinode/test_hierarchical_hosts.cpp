// Hierarchical collectives across real hosts: each host a network namespace
// of a TestCluster, each rank a process of `tandem launch`. The worker
// checks all_reduce, reduce_scatter and all_gather against closed forms and
// which path its world group took.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "multinode/static_job.h"

namespace tandem {
namespace {

using testing::bin;
using testing::TestCluster;

// Runs `nproc` workers on each of the cluster's hosts expecting `form`, and
// returns every host's output (exit codes checked).
std::string run_job(TestCluster& cluster, int nproc, const std::string& form,
                    const std::string& port) {
  return testing::run_static_job(cluster, nproc, port, {}, {bin("hierarchical_test_worker"), form},
                                 {"TANDEM_TIMEOUT_S=20"}, 60);
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

TEST(MultiNodeHierarchical, ThreeHostsOfTwoRanksSplitTheExchangeAcrossEachHostsRanks) {
  TestCluster cluster(3);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string all = run_job(cluster, 2, "split", "29655");
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_NE(all.find("rank " + std::to_string(rank) + "/6 hierarchical=split checks ok"),
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
