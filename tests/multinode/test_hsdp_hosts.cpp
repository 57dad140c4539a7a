// HSDP across real hosts: each host a network namespace of a TestCluster,
// each rank a process of `tandem launch` with a DeepSpeed config that shards
// inside each host (zero_hpz_partition_size = ranks per host) and
// replicates across hosts. The README quickstart's model, trained on a fixed
// global batch, must end where one process ends (1e-5 relative, as the
// hostfile job's DDP run), and the checkpoint must say HSDP held it.

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "multinode/hostfile_cluster.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "support/test_cluster.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::max_relative_diff;
using testing::ScratchDir;
using testing::TestCluster;

// Trains 30 steps of global batch 24 on `hosts` x `nproc` ranks under
// `config`; returns the largest relative difference to one process.
double hsdp_against_one_process(int hosts, int nproc, const std::string& port) {
  TestCluster cluster(hosts);
  if (!cluster.ok()) return -1;
  ScratchDir dir;
  const std::string config = dir / "hsdp.json";
  std::ofstream(config) << R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": )"
                        << nproc << "}}";
  const std::string one = dir / "one.safetensors";
  const std::string many = dir / "many.safetensors";
  auto alone = testing::run_process({bin("quickstart_worker"), "30", "24", one}, 120);
  EXPECT_EQ(alone.exit_code, 0) << alone.out << alone.err;
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, 'p');
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int node = 0; node < hosts; ++node) {
    nodes.push_back(std::make_unique<BackgroundProcess>(
        cluster.on(node, {bin("tandem"), "launch", "--nnodes", std::to_string(hosts),
                          "--node-rank", std::to_string(node), "--nproc-per-node",
                          std::to_string(nproc), "--master-addr", cluster.address(0),
                          "--master-port", port, "--config-file", config,
                          bin("quickstart_worker"), "30", "24", many, dir / "ckpt", "30"}),
        std::vector<std::string>{token, "TANDEM_TIMEOUT_S=60"}));
  }
  for (int node = 0; node < hosts; ++node) {
    auto r = nodes[static_cast<std::size_t>(node)]->wait(180);
    EXPECT_EQ(r.exit_code, 0) << "host " << node << ": " << r.out << r.err;
  }
  std::ifstream meta(dir / "ckpt/global_step30/meta.json");
  const std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"hsdp\""), std::string::npos) << text;
  return max_relative_diff(many, one);
}

TEST(MultiNodeHsdp, TwoHostsOfTwoRanksShardInsideEachHost) {
  const double diff = hsdp_against_one_process(2, 2, "29671");
  if (diff < 0) GTEST_SKIP() << "skipped: no namespace cluster (needs root and iproute2)";
  EXPECT_LE(diff, 1e-5) << "2 hosts x 2 ranks (HSDP) against one process";
}

TEST(MultiNodeHsdp, ThreeHostsOfTwoRanksShardInsideEachHost) {
  const double diff = hsdp_against_one_process(3, 2, "29673");
  if (diff < 0) GTEST_SKIP() << "skipped: no namespace cluster (needs root and iproute2)";
  EXPECT_LE(diff, 1e-5) << "3 hosts x 2 ranks (HSDP) against one process";
}

}  // namespace
}  // namespace tandem
