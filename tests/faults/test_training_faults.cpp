// Training under faults, with real processes through `tandem launch`: a
// worker killed mid-training and the group restarted, a hung rank, NaN on
// one rank, uneven data, a corrupt checkpoint. The weights a run ends with
// are compared bit-exactly (fault_worker prints a hash of every parameter).

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <random>
#include <regex>

#include "support/launch_testing.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::launch;
using testing::none_alive;
using testing::ProcessResult;
using testing::read_pids;
using testing::run_process;
using testing::TempDir;
using testing::wait_for_pids;

// Collective timeout of the runs that are meant to time out.
const char* kShortTimeout = "TANDEM_TIMEOUT_S=3";

std::vector<std::string> fault_job(std::vector<std::string> worker_args,
                                   std::vector<std::string> launch_args = {}) {
  std::vector<std::string> argv = {"--nproc-per-node", "2"};
  argv.insert(argv.end(), launch_args.begin(), launch_args.end());
  argv.push_back(bin("fault_worker"));
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return launch(argv);
}

// "rank R weights <hash> ..." of every rank: the hashes, by rank.
std::vector<std::string> weights(const std::string& out, int world = 2) {
  std::vector<std::string> hashes(world);
  std::regex line(R"(rank (\d+) weights ([0-9a-f]{16}))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    int rank = std::stoi((*it)[1]);
    if (rank < world) hashes[rank] = (*it)[2];
  }
  return hashes;
}

// The step of the tag that DIR/latest names ("global_step120" -> 120); 0
// while there is none.
int64_t latest_step(const std::string& dir) {
  const std::string tag = testing::read_file(dir + "/latest");
  const auto digits = tag.find_first_of("0123456789");
  return digits == std::string::npos ? 0 : std::stoll(tag.substr(digits));
}

// Runs a job and checks that none of its workers outlives it.
ProcessResult run_job(const std::vector<std::string>& argv, std::vector<std::string> env = {}) {
  TempDir pid_dir;
  env.push_back("TANDEM_TEST_PID_DIR=" + pid_dir.path());
  ProcessResult r = run_process(argv, 180, env);
  EXPECT_FALSE(r.timed_out) << r.out << r.err;
  auto pids = read_pids(pid_dir.path(), 2);
  EXPECT_EQ(pids.size(), 2u) << "the workers did not start";
  EXPECT_TRUE(none_alive(pids, 1.0)) << "a worker outlived its job";
  return r;
}

// Runs `argv` and expects success; returns rank 0's weight hash after
// checking that every rank ended with the same weights.
std::string run_to_end(const std::vector<std::string>& argv) {
  ProcessResult r = run_job(argv);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  auto hashes = weights(r.out);
  EXPECT_FALSE(hashes[0].empty()) << r.out;
  EXPECT_EQ(hashes[0], hashes[1]) << "ranks ended with different weights\n" << r.out;
  return hashes[0];
}

// Issue 8's acceptance: with --max-restarts 1, a worker killed with SIGKILL
// at a random point of training (after the first checkpoint) is restarted
// with the whole group, resumes from `latest`, and ends with weights
// byte-identical to an uninterrupted run.
TEST(TrainingFaults, KillAndRestartReproducesTheStraightRunBitExactly) {
  TempDir dir;
  const std::vector<std::string> train = {"--steps", "240", "--save-every", "20"};
  auto with_dir = [&](const std::string& name) {
    auto args = train;
    args.insert(args.end(), {"--checkpoint-dir", dir.path() + "/" + name});
    return args;
  };
  const std::string straight = run_to_end(fault_job(with_dir("straight")));

  std::mt19937 rng(8);
  std::uniform_int_distribution<int> events_before_kill(0, 24);
  const std::string checkpoints = dir.path() + "/killed";
  ::mkdir(checkpoints.c_str(), 0755);
  TempDir pid_dir;
  BackgroundProcess job(fault_job(with_dir("killed"), {"--max-restarts", "1"}),
                        {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
  auto pids = wait_for_pids(pid_dir.path(), 2);
  ASSERT_EQ(pids.size(), 2u) << "workers did not start";
  // The k-th file event in the checkpoint directory after the first commit:
  // mid-step or mid-save, wherever that falls. Events that arrive while this
  // process is not running (a loaded machine) reach it as one wake-up, so
  // the run could end before k wake-ups: kill by the time `latest` is half
  // way (step 120 of 240) whatever k says.
  const int k = events_before_kill(rng);
  int seen = 0;
  ASSERT_TRUE(testing::wait_for_files(
      checkpoints,
      [&] {
        return testing::file_exists(checkpoints + "/latest") &&
               (seen++ >= k || latest_step(checkpoints) >= 120);
      },
      120))
      << "no checkpoint was committed";
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0) << "rank 1 had already finished";
  ProcessResult r = job.wait(180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("Root cause: rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting all 2 workers (restart 1 of 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("resumed at step"), std::string::npos) << r.out;
  auto hashes = weights(r.out);
  EXPECT_EQ(hashes[0], hashes[1]) << r.out;
  EXPECT_EQ(hashes[0], straight) << "the restarted run's weights differ from the straight run's";
  EXPECT_TRUE(none_alive(pids, 1.0));
  EXPECT_TRUE(none_alive(read_pids(pid_dir.path(), 2), 1.0));
}

TEST(TrainingFaults, HungRankTimesOutNamingItTheOperationAndTheSequenceNumber) {
  ProcessResult r = run_job(fault_job({"--hang-at", "4"}), {kShortTimeout});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(r.seconds, 60);
  EXPECT_NE(r.err.find("Root cause: rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("TimeoutError"), std::string::npos) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex("all_reduce #[0-9]+ Float"))) << r.err;
  EXPECT_NE(r.err.find("rank 1 did not arrive"), std::string::npos) << r.err;
}

TEST(TrainingFaults, NanOnOneRankSkipsTheStepOnEveryRankWithLossScaling) {
  ProcessResult r = run_job(fault_job({"--steps", "20", "--nan-at", "5", "--loss-scaling"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto hashes = weights(r.out);
  EXPECT_EQ(hashes[0], hashes[1]) << r.out;
  EXPECT_NE(r.out.find("rank 0 weights " + hashes[0] + " steps 20 skipped 1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank 1 weights " + hashes[1] + " steps 20 skipped 1"), std::string::npos)
      << r.out;
}

TEST(TrainingFaults, UnevenDataWithoutJoinTimesOutNamingTheRankThatRanOut) {
  ProcessResult r = run_job(fault_job({"--uneven-epochs", "2"}), {kShortTimeout});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("TimeoutError"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 did not arrive"), std::string::npos) << r.err;
  // Rank 1 ran out of batches and finished; the summary shows it.
  EXPECT_NE(r.err.find("rank 1 (pid"), std::string::npos) << r.err;
}

TEST(TrainingFaults, UnevenDataInJoinModeFinishesWithEqualWeights) {
  ProcessResult r = run_job(fault_job({"--uneven-epochs", "2", "--join"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto hashes = weights(r.out);
  EXPECT_FALSE(hashes[0].empty()) << r.out;
  EXPECT_EQ(hashes[0], hashes[1]) << r.out;
  // Rank 0 has 9 batches an epoch, rank 1 has 8 and shadows the 9th.
  EXPECT_NE(r.out.find("rank 1 weights " + hashes[1] + " steps 18 skipped 0 micro 18"),
            std::string::npos)
      << r.out;
}

TEST(TrainingFaults, CorruptLatestCheckpointFailsClearlyAndThePreviousOneResumesExactly) {
  TempDir dir;
  const std::string straight =
      run_to_end(fault_job({"--steps", "40", "--checkpoint-dir", dir.path() + "/straight"}));
  const std::string checkpoints = dir.path() + "/run";
  run_to_end(fault_job({"--steps", "20", "--save-every", "10", "--checkpoint-dir", checkpoints}));
  // Flip one byte near the end of the data of the latest tag's rank file.
  const std::string file = checkpoints + "/global_step20/rank_00000.safetensors";
  std::string bytes = testing::read_file(file);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 9] ^= 0x10;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;

  ProcessResult bad = run_job(fault_job({"--steps", "40", "--checkpoint-dir", checkpoints}));
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.err.find("CheckpointError"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("rank_00000.safetensors"), std::string::npos) << bad.err;

  const std::string resumed = run_to_end(fault_job(
      {"--steps", "40", "--checkpoint-dir", checkpoints, "--resume-tag", "global_step10"}));
  EXPECT_EQ(resumed, straight) << "resuming from the last good checkpoint is not exact";
}

}  // namespace
}  // namespace tandem
