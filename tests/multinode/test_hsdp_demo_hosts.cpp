// HSDP at stage 3 across real hosts: the demo (examples/gpt_addition, whose
// transformer blocks are tandem::Sharded units) trained by 2 namespace hosts
// x 2 ranks, once as ZeRO-3 over all four ranks and once as HSDP (shard
// groups of the 2 ranks of each host, replicated across the hosts). Both
// average the same gradients in a different order, so the losses after 30
// steps agree to 1e-3 relative (as the one-host e2e test, HsdpDemo).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "multinode/static_job.h"
#include "support/demo_report.h"
#include "support/scratch_dir.h"

namespace tandem {
namespace {

using testing::bin;
using testing::ScratchDir;
using testing::TestCluster;

// The demo's final report ({"step": 30, "loss": ...}) in a job's output.
nlohmann::json demo_final_report(const std::string& out) { return testing::demo_report_at(out, 30); }

TEST(MultiNodeHsdpDemo, Stage3AcrossTwoHostsTracksZero3) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  ScratchDir dir;
  const std::string zero3 = dir / "zero3.json";
  std::ofstream(zero3) << R"({"zero_optimization": {"stage": 3}})";
  const std::string hsdp = dir / "hsdp.json";
  std::ofstream(hsdp) << R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})";
  const std::vector<std::string> demo = {bin("gpt_addition"), "--max-steps", "30",
                                         "--train-size", "4096", "--test-size", "100",
                                         "--log-every", "10"};
  auto run = [&](const std::string& config, const std::string& port) {
    return demo_final_report(testing::run_static_job(cluster, 2, port, {"--config-file", config},
                                                     demo, {"TANDEM_TIMEOUT_S=120"}, 300));
  };
  const auto reference = run(zero3, "29681");
  const auto hybrid = run(hsdp, "29683");
  ASSERT_TRUE(reference.contains("loss") && hybrid.contains("loss"));
  const double loss = reference["loss"].get<double>();
  EXPECT_LT(std::abs(hybrid["loss"].get<double>() - loss), 1e-3 * loss)
      << "hsdp " << hybrid << " vs zero-3 " << reference;
  std::printf("2 hosts x 2 ranks, 30 steps: loss %.6f (ZeRO-3), %.6f (HSDP)\n", loss,
              hybrid["loss"].get<double>());
}

}  // namespace
}  // namespace tandem
