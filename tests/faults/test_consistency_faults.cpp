// Start-up consistency with real processes through `tandem launch`: ranks
// that read different configs, or build different models, must stop the
// job at once with a message naming the key and the ranks, and leave no
// process behind.

#include <gtest/gtest.h>

#include <fstream>

#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::BackgroundProcess;
using testing::ProcessResult;
using testing::read_file;
using testing::TempDir;
using testing::wait_for_exit;

constexpr int kWorld = 2;

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<pid_t> read_pids(const std::string& dir) {
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    const std::string text = read_file(dir + "/rank" + std::to_string(r) + ".pid");
    if (!text.empty()) pids.push_back(std::stoi(text));
  }
  return pids;
}

struct LaunchRun {
  ProcessResult result;
  std::vector<pid_t> worker_pids;
};

// `tandem launch` of consistency_worker ARGS on kWorld local ranks.
LaunchRun launch_worker(const std::vector<std::string>& args) {
  TempDir pid_dir;
  std::vector<std::string> argv = {bin("tandem"), "launch", "--nproc-per-node",
                                   std::to_string(kWorld), "--standalone",
                                   bin("consistency_worker")};
  argv.insert(argv.end(), args.begin(), args.end());
  BackgroundProcess launcher(argv, {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  LaunchRun run;
  run.result = launcher.wait(60);
  run.worker_pids = read_pids(pid_dir.path());
  return run;
}

void expect_no_survivors(const LaunchRun& run) {
  EXPECT_EQ(run.worker_pids.size(), static_cast<size_t>(kWorld)) << "workers did not start";
  for (pid_t pid : run.worker_pids) {
    EXPECT_TRUE(wait_for_exit(pid, 1.0)) << "worker pid " << pid << " outlived the launcher";
  }
}

TEST(ConsistencyFaults, SameConfigOnEveryRankStarts) {
  TempDir dir;
  write(dir.path() + "/config.yaml", "gradient_accumulation_steps: 2\n");
  const LaunchRun run = launch_worker({"config", dir.path()});
  ASSERT_FALSE(run.result.timed_out);
  EXPECT_EQ(run.result.exit_code, 0) << run.result.out << run.result.err;
  EXPECT_NE(run.result.out.find("rank 1/2 consistent"), std::string::npos) << run.result.out;
  expect_no_survivors(run);
}

TEST(ConsistencyFaults, ConfigMismatchAcrossRanksStopsTheJobAndNamesTheKey) {
  TempDir dir;
  // Rank 1 reads a stale copy, as a node with an old file would.
  write(dir.path() + "/config.yaml", "gradient_accumulation_steps: 2\nmixed_precision: bf16\n");
  write(dir.path() + "/rank1.yaml", "gradient_accumulation_steps: 4\nmixed_precision: bf16\n");
  const LaunchRun run = launch_worker({"config", dir.path()});
  ASSERT_FALSE(run.result.timed_out) << "a config mismatch must fail fast, not hang";
  EXPECT_EQ(run.result.exit_code, 1) << run.result.out << run.result.err;
  const std::string output = run.result.out + run.result.err;
  EXPECT_NE(output.find("config differs across ranks: gradient_accumulation_steps: 2 on rank 0 "
                        "but 4 on rank 1"),
            std::string::npos)
      << output;
  EXPECT_EQ(output.find("mixed_precision:"), std::string::npos) << "only differing keys: " << output;
  EXPECT_NE(output.find("tandem launch: job failed"), std::string::npos) << output;
  EXPECT_EQ(output.find("consistent\n"), std::string::npos) << "no rank may start: " << output;
  expect_no_survivors(run);
}

TEST(ConsistencyFaults, ModelMismatchAcrossRanksStopsTheJobAndNamesTheParameter) {
  const LaunchRun run = launch_worker({"model", "1"});
  ASSERT_FALSE(run.result.timed_out) << "a model mismatch must fail fast, not hang";
  EXPECT_EQ(run.result.exit_code, 1) << run.result.out << run.result.err;
  const std::string output = run.result.out + run.result.err;
  EXPECT_NE(output.find("model differs across ranks: parameter fc.weight is Float[10, 4] on rank "
                        "0 but Float[10, 5] on rank 1"),
            std::string::npos)
      << output;
  expect_no_survivors(run);
}

}  // namespace
}  // namespace tandem
