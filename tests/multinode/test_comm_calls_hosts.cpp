// Subgroups, the mesh, point to point, all_to_all, gather and scatter across
// real hosts: each host a network namespace of a TestCluster, each rank a
// process of `tandem launch`. The worker (workers/comm_calls_worker.cpp)
// checks every result against a closed form; inside a host send/recv and the
// local group use shared memory, between hosts Gloo.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "multinode/static_job.h"

namespace tandem {
namespace {

using testing::bin;
using testing::TestCluster;

// Runs `nproc` comm_calls_worker ranks on each host; returns all output.
std::string run_comm_calls(TestCluster& cluster, int nproc, const std::string& port) {
  return testing::run_static_job(cluster, nproc, port, {}, {bin("comm_calls_worker")},
                                 {"TANDEM_TIMEOUT_S=30"}, 90);
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
