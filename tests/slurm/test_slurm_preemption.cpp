// Preemption under a real Slurm: examples/slurm/train.sbatch runs the
// quickstart worker on 2 hosts x 2 ranks with the config's preemption
// block; a signal at a random step (scancel --signal=USR1 --full, as
// `sbatch --signal` would send before a time limit, or a SIGTERM) makes
// every rank save at one agreed step, the job requeues itself and resumes
// from that checkpoint, and its final parameters are bit-identical to the
// same job run without interruption.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "multinode/hostfile_cluster.h"
#include "support/slurm_cluster.h"
#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::max_relative_diff;
using testing::read_file;
using testing::run_process;
using testing::wait_for_files;
using testing::SlurmCluster;

constexpr int kPreemptedJobSteps = 80;

std::string config_file(const SlurmCluster& slurm, const std::string& name,
                        const std::string& checkpoint_dir, const std::string& extra) {
  const std::string path = slurm.shared() + "/" + name + ".yaml";
  std::ofstream(path) << "preemption:\n  enabled: true\n  checkpoint_dir: " << checkpoint_dir
                      << "\n  signals: [USR1, TERM]\n  requeue: auto\n"
                      << extra;
  return path;
}

// Submits train.sbatch; returns the job id. Its output goes to
// shared/<name>.out, its parameters to shared/<name>.safetensors.
std::string submit(SlurmCluster& slurm, const std::string& name, const std::string& mode,
                   const std::string& extra_config) {
  const bool stage3 = extra_config.find("stage: 3") != std::string::npos;
  const std::string dir = slurm.shared();
  const std::string ckpt = dir + "/" + name + "-ckpt";
  const std::string config = config_file(slurm, name, ckpt, extra_config);
  std::string error;
  const std::string job = slurm.submit(
      {"--chdir", dir, "--output", dir + "/" + name + ".out", "--cpus-per-task=2",
       "--export=ALL,MODE=" + mode + ",WORKERS_PER_NODE=2,TANDEM=" + bin("tandem") +
           ",PROGRAM=" + bin("quickstart_worker") + ",CHECKPOINT_DIR=" + ckpt +
           ",TANDEM_CONFIG_FILE=" + config + ",TANDEM_TEST_STEP_DELAY_MS=40,TANDEM_TIMEOUT_S=60" +
           (stage3 ? ",TANDEM_TEST_SHARDED=1" : ""),
       std::string(TANDEM_SOURCE_DIR) + "/examples/slurm/train.sbatch", std::to_string(kPreemptedJobSteps),
       "24", dir + "/" + name + ".safetensors"},
      &error);
  EXPECT_FALSE(job.empty()) << error;
  return job;
}

// Waits until the job's output shows rank 0 past `step` (woken by each
// write to the output's folder).
bool wait_for_step(const std::string& out, int step, double timeout_s) {
  const std::string line = "step " + std::to_string(step) + "\n";
  return wait_for_files(out.substr(0, out.rfind('/')),
                        [&] { return read_file(out).find(line) != std::string::npos; },
                        timeout_s);
}

void preempt_requeue_resume(const std::string& mode, const std::string& signal,
                            const std::string& extra_config) {
  SlurmCluster slurm(2);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  const std::string dir = slurm.shared();
  // The uninterrupted job.
  const std::string straight = submit(slurm, "straight", mode, extra_config);
  ASSERT_EQ(slurm.wait_for_job(straight, {"COMPLETED", "FAILED", "CANCELLED"}, 180), "COMPLETED")
      << read_file(dir + "/straight.out") << slurm.diagnostics();

  // The same job, signalled at a random step.
  std::random_device seed;
  const int at = std::uniform_int_distribution<int>(5, kPreemptedJobSteps - 20)(seed);
  SCOPED_TRACE("signal " + signal + " after step " + std::to_string(at) + ", mode " + mode);
  const std::string job = submit(slurm, "preempted", mode, extra_config);
  const std::string out = dir + "/preempted.out";
  ASSERT_TRUE(wait_for_step(out, at, 120)) << read_file(out) << slurm.diagnostics();
  // USR1 as `sbatch --signal` sends it (--full: the batch shell too); TERM
  // as a preemption reaches the tasks.
  std::vector<std::string> scancel = {"scancel", "--signal=" + signal, job};
  if (signal == "USR1") scancel.insert(scancel.begin() + 2, "--full");
  auto sent = run_process(slurm.login(scancel), 30);
  ASSERT_EQ(sent.exit_code, 0) << sent.out << sent.err;
  // Requeued: pending again, eligible only after Slurm's delay; start it now.
  const std::string pending = slurm.wait_for_job(job, {"PENDING", "COMPLETED", "FAILED"}, 120);
  ASSERT_EQ(pending, "PENDING") << read_file(out) << slurm.diagnostics();
  // slurmd refuses a launch credential made in the same second as the
  // kill the requeue caused ("Job N already killed, do not launch batch
  // job": its revocation check counts whole seconds); Slurm's own requeue
  // delay is far longer. Two seconds clear it.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto now = run_process(slurm.login({"scontrol", "update", "JobId=" + job, "StartTime=now"}), 30);
  ASSERT_EQ(now.exit_code, 0) << now.out << now.err;
  ASSERT_EQ(slurm.wait_for_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, 180), "COMPLETED")
      << read_file(out) << slurm.diagnostics();

  const std::string log = read_file(out);
  EXPECT_NE(log.find("preemption: SIG" + signal + " reached the job"), std::string::npos) << log;
  EXPECT_NE(log.find("exiting with code 75"), std::string::npos) << log;
  EXPECT_NE(log.find("requeuing Slurm job " + job), std::string::npos) << log;
  EXPECT_NE(log.find("restart 1,"), std::string::npos) << log;
  EXPECT_EQ(slurm.job_field(job, "Restarts"), "1");
  // It stopped after the signal, at one step, and resumed at that step.
  const auto stopped_at = log.find("every rank stops after optimizer step ");
  ASSERT_NE(stopped_at, std::string::npos) << log;
  const int stopped = std::stoi(log.substr(stopped_at + 38));
  EXPECT_GE(stopped, at);
  EXPECT_LT(stopped, kPreemptedJobSteps);
  EXPECT_NE(log.find("resumed at step " + std::to_string(stopped) + " on 4 ranks"),
            std::string::npos)
      << log;
  EXPECT_EQ(max_relative_diff(dir + "/preempted.safetensors", dir + "/straight.safetensors"), 0.0)
      << "the preempted and resumed job must end bit-identical to the uninterrupted one";
}

TEST(SlurmPreemption, Usr1AtARandomStepSavesRequeuesAndResumesBitExactly) {
  preempt_requeue_resume("srun", "USR1", "");
}

TEST(SlurmPreemption, SigtermUnderOneLauncherPerNodeWithZero2ResumesBitExactly) {
  preempt_requeue_resume("launch", "TERM", "zero_optimization:\n  stage: 2\n");
}

TEST(SlurmPreemption, Usr1WithZero3ShardedUnitsResumesBitExactly) {
  preempt_requeue_resume("srun", "USR1", "zero_optimization:\n  stage: 3\n");
}

}  // namespace
}  // namespace tandem
