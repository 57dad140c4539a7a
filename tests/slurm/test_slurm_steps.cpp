// What Slurm does to a job's steps, under a real Slurm. Two srun steps of
// one job running at once on one node (the audit's jobs 10068 and 10074):
// each step must be its own job; without MASTER_PORT each step derives its
// own port, with one MASTER_PORT for both the store refuses the other
// step's ranks, saying so. And a time limit with no warning signal under
// one launcher per node (jobs 10060 and 10062): the launchers get SIGTERM
// twice, and the workers must still save.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "support/slurm_cluster.h"
#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::read_file;
using testing::SlurmCluster;

// Runs a batch job on one node whose script starts steps a and b at once
// (srun --overlap -n2 each), `exports` first; returns both steps' output.
std::string two_steps_at_once(SlurmCluster& slurm, const std::string& exports,
                              std::string* job) {
  const std::string dir = slurm.shared();
  const std::string script = dir + "/two_steps.sbatch";
  std::ofstream(script) << "#!/bin/sh\n"
                        << "export TANDEM_STORE_TOKEN=" << std::string(64, 'e')
                        << " TANDEM_TIMEOUT_S=30 " << exports << "\n"
                        << "for s in a b; do\n"
                        << "  srun --overlap -n2 " << bin("quickstart_worker") << " 30 24 " << dir
                        << "/$s.safetensors > " << dir << "/$s.log 2>&1 &\n"
                        << "done\n"
                        << "wait\n";
  ::chmod(script.c_str(), 0755);
  std::string error;
  *job = slurm.submit({"-N1", "-n2", "--output", dir + "/two_steps.out", script}, &error);
  EXPECT_FALSE(job->empty()) << error << slurm.diagnostics();
  if (job->empty()) return "";
  const std::string state = slurm.wait_for_job(*job, {"COMPLETED", "FAILED"}, 180);
  EXPECT_TRUE(state == "COMPLETED" || state == "FAILED")
      << "job " << *job << " is " << state << " (a step hangs?)" << slurm.diagnostics();
  return "step a:\n" + read_file(dir + "/a.log") + "step b:\n" + read_file(dir + "/b.log");
}

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(SlurmSteps, TwoStepsOfOneJobAtOnceEachTrainOnItsOwnPort) {
  SlurmCluster slurm(1);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  std::string job;
  const std::string logs = two_steps_at_once(slurm, "", &job);
  EXPECT_EQ(count(logs, "{\"world\": 2, \"steps\": 30"), 2) << logs;
  EXPECT_EQ(logs.find("belongs to Slurm job step"), std::string::npos) << logs;
}

TEST(SlurmSteps, TwoStepsOfOneJobWithOneMasterPortAreRefusedNotJoined) {
  SlurmCluster slurm(1);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  std::string job;
  const std::string logs = two_steps_at_once(slurm, "MASTER_PORT=29555", &job);
  // One step trains; the other's rank that reached the first step's store
  // is refused, naming both steps, instead of training in its job.
  EXPECT_EQ(count(logs, "{\"world\": 2, \"steps\": 30"), 1) << logs;
  EXPECT_NE(logs.find("belongs to Slurm job step " + job + "."), std::string::npos) << logs;
  EXPECT_NE(logs.find("but this process runs in step " + job + "."), std::string::npos) << logs;
}

TEST(SlurmSteps, ATimeLimitWithoutAWarningSignalSavesUnderOneLauncherPerNode) {
  SlurmCluster slurm(2);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  const std::string dir = slurm.shared();
  const std::string ckpt = dir + "/ckpt";
  const std::string config = dir + "/preempt.yaml";
  std::ofstream(config) << "preemption:\n  enabled: true\n  checkpoint_dir: " << ckpt
                        << "\n  signals: [USR1, TERM]\n  requeue: false\n";
  const std::string script = dir + "/time_limit.sbatch";
  // As examples/slurm/train.sbatch waits: a SIGTERM to the script does not
  // end it before srun.
  std::ofstream(script) << "#!/bin/bash\n"
                        << "export TANDEM_STORE_TOKEN=" << std::string(64, 'e')
                        << " TANDEM_CONFIG_FILE=" << config
                        << " TANDEM_TEST_STEP_DELAY_MS=100 TANDEM_TIMEOUT_S=60\n"
                        << "srun --ntasks-per-node=1 " << bin("tandem")
                        << " launch --nproc-per-node 2 " << bin("quickstart_worker") << " 3000 24 "
                        << dir << "/out.safetensors &\n"
                        << "child=$!\ntrap ':' TERM\n"
                        << "wait $child\nwhile kill -0 $child 2>/dev/null; do wait $child; done\n";
  ::chmod(script.c_str(), 0755);
  std::string error;
  const std::string job = slurm.submit(
      {"-N2", "--ntasks-per-node=1", "--time=1", "--output", dir + "/time_limit.out", script},
      &error);
  ASSERT_FALSE(job.empty()) << error << slurm.diagnostics();
  const std::string state = slurm.wait_for_job(job, {"TIMEOUT", "COMPLETED", "FAILED"}, 240);
  const std::string log = read_file(dir + "/time_limit.out");
  EXPECT_EQ(state, "TIMEOUT") << log << slurm.diagnostics();
  EXPECT_NE(log.find("preemption: SIGTERM reached the job"), std::string::npos) << log;
  EXPECT_NE(log.find("with a checkpoint in " + ckpt), std::string::npos) << log;
  struct stat latest {};
  EXPECT_EQ(::stat((ckpt + "/latest").c_str(), &latest), 0) << "no checkpoint saved\n" << log;
}

}  // namespace
}  // namespace tandem
