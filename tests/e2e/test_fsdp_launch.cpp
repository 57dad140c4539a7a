// Accelerate FSDP configs through `tandem launch --config_file`, end to end
// (real processes, the demo examples/gpt_addition, whose transformer blocks
// are tandem::Sharded units): the launcher takes the process count and the
// machines from the file, the workers map fsdp_config onto tandem's ZeRO
// strategies, and HYBRID_SHARD's "ranks per host" is the LOCAL_WORLD_SIZE
// the launcher exports. The losses after 30 steps track ZeRO-3 over the
// same ranks (the same averages in another order: 1e-3 relative, as the
// HsdpDemo test), and the checkpoint records how the model was held.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/demo_report.h"
#include "support/reserved_port.h"
#include "support/subprocess.h"
#include "tandem/checkpoint/checkpoint.h"

namespace tandem {
namespace fsdp_launch_test {

using testing::BackgroundProcess;
using testing::bin;
using testing::run_process;
using testing::TempDir;

const std::vector<std::string> kDemo = {"--max-steps", "30", "--train-size", "4096",
                                        "--test-size", "100", "--log-every", "10"};

// The demo's final report ({"step": 30, "loss": ...}) in a job's output.
nlohmann::json final_report(const std::string& out) { return testing::demo_report_at(out, 30); }

std::vector<std::string> launch(const std::vector<std::string>& flags,
                                const std::vector<std::string>& demo_flags = {}) {
  std::vector<std::string> argv = {bin("tandem"), "launch"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(bin("gpt_addition"));
  argv.insert(argv.end(), kDemo.begin(), kDemo.end());
  argv.insert(argv.end(), demo_flags.begin(), demo_flags.end());
  return argv;
}

// ZeRO-3 over 4 ranks on one machine: the reference loss.
double zero3_loss(const TempDir& dir) {
  const std::string zero3 = dir.path() + "/zero3.json";
  // No clipping, as the FSDP runs (a DeepSpeed JSON clips at 1.0 unless it
  // says otherwise; Accelerate's FSDP does not clip).
  std::ofstream(zero3) << R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3}})";
  auto r = run_process(launch({"--standalone", "--nproc-per-node", "4", "--config-file", zero3}),
                       300);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return final_report(r.out).value("loss", -1.0);
}

// One machine: `num_processes: 4` starts four ranks (no --nproc-per-node),
// and HYBRID_SHARD's host is all of them, one shard group.
TEST(FsdpLaunch, OneMachineTakesTheProcessCountFromTheFileAndShardsOverIt) {
  TempDir dir;
  const double reference = zero3_loss(dir);
  const std::string yaml = dir.path() + "/fsdp.yaml";
  std::ofstream(yaml) << "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n"
                         "fsdp_config:\n  fsdp_version: 1\n  fsdp_sharding_strategy: HYBRID_SHARD\n"
                         "  fsdp_backward_prefetch: BACKWARD_PRE\n"
                         "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                         "mixed_precision: 'no'\nnum_machines: 1\nnum_processes: 4\nuse_cpu: true\n";
  const std::string checkpoints = dir.path() + "/ckpt";
  auto r = run_process(launch({"--standalone", "--config_file", yaml},
                              {"--checkpoint-dir", checkpoints, "--save-every", "30"}),
                       300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto report = final_report(r.out);
  EXPECT_LT(std::abs(report.value("loss", -1.0) - reference), 1e-3 * reference)
      << report << " vs zero-3 " << reference;
  const auto meta = read_checkpoint_meta(checkpoints + "/global_step30");
  EXPECT_EQ(meta["world_size"], 4);
  EXPECT_EQ(meta["strategy"], "hsdp");
  EXPECT_EQ(meta["zero_stage"], 3);
  EXPECT_EQ(meta["hpz_partition_size"], 4);  // the ranks of this one host
}

// Two launchers on this machine stand in for two machines of two ranks:
// HYBRID_SHARD shards inside each launcher's pair and replicates across
// them, as zero_hpz_partition_size 2 would.
TEST(FsdpLaunch, HybridShardOnTwoMachinesOfTwoRanksShardsInsideEach) {
  TempDir dir;
  const double reference = zero3_loss(dir);
  testing::ReservedPort port(/*shareable=*/true);
  ASSERT_NE(port.port(), 0);
  const std::string yaml = dir.path() + "/fsdp.yaml";
  std::ofstream(yaml) << "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n"
                         "fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n"
                         "mixed_precision: 'no'\nnum_machines: 2\nnum_processes: 4\n"
                         "main_process_ip: 127.0.0.1\nmain_process_port: "
                      << port.port() << "\nuse_cpu: true\n";
  const std::string checkpoints = dir.path() + "/ckpt";
  const std::vector<std::string> env = {"TANDEM_STORE_TOKEN=" + std::string(64, '4'),
                                        "TANDEM_TIMEOUT_S=120"};
  const std::vector<std::string> save = {"--checkpoint-dir", checkpoints, "--save-every", "30"};
  BackgroundProcess head(launch({"--config_file", yaml, "--machine_rank", "0"}, save), env);
  BackgroundProcess other(launch({"--config_file", yaml, "--machine_rank", "1"}, save), env);
  const auto head_run = head.wait(300);
  const auto other_run = other.wait(60);
  ASSERT_EQ(head_run.exit_code, 0) << head_run.out << head_run.err;
  ASSERT_EQ(other_run.exit_code, 0) << other_run.out << other_run.err;
  const auto report = final_report(head_run.out);
  EXPECT_LT(std::abs(report.value("loss", -1.0) - reference), 1e-3 * reference)
      << report << " vs zero-3 " << reference;
  const auto meta = read_checkpoint_meta(checkpoints + "/global_step30");
  EXPECT_EQ(meta["world_size"], 4);
  EXPECT_EQ(meta["strategy"], "hsdp");
  EXPECT_EQ(meta["hpz_partition_size"], 2);  // each launcher's LOCAL_WORLD_SIZE
}

}  // namespace fsdp_launch_test
}  // namespace tandem
