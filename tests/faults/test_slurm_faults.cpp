// What Slurm does to a job, without Slurm: the environment srun gives a
// task, reproduced on one machine with real processes. The same situations under a real Slurm are in tests/slurm/.

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "support/launch_testing.h"
#include "support/reserved_port.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::ReservedPort;

// The environment srun gives task `proc` of step `step` of job 10068
// (2 tasks on one node), with the batch script's MASTER_PORT and token.
std::vector<std::string> srun_task_env(const std::string& step, int proc, int port) {
  return {"SLURM_JOB_ID=10068",
          "SLURM_STEP_ID=" + step,
          "SLURM_STEP_NODELIST=localhost",
          "SLURM_JOB_NODELIST=localhost",
          "SLURM_STEP_NUM_TASKS=2",
          "SLURM_STEP_TASKS_PER_NODE=2",
          "SLURM_NODEID=0",
          "SLURM_PROCID=" + std::to_string(proc),
          "SLURM_LOCALID=" + std::to_string(proc),
          "MASTER_ADDR=127.0.0.1",
          "MASTER_PORT=" + std::to_string(port),
          "TANDEM_STORE_TOKEN=0123456789abcdef0123456789abcdef",
          "TANDEM_TIMEOUT_S=20"};
}

// Job 10068: two srun steps at once with one MASTER_PORT and one token.
// Step 0's rank 0 hosts the store; step 1's rank 1 reaches it. It must be
// refused, naming both steps and the fix, not join step 0's job.
TEST(SlurmFaults, ARankOfAnotherStepOfTheJobIsRefusedByTheStoreNamingBothSteps) {
  ReservedPort port(/*shareable=*/true);
  ASSERT_GT(port.port(), 0);
  BackgroundProcess step0_rank0({bin("launch_test_worker"), "allreduce"},
                                srun_task_env("0", 0, port.port()));
  BackgroundProcess step1_rank1({bin("launch_test_worker"), "allreduce"},
                                srun_task_env("1", 1, port.port()));
  const auto r = step1_rank1.wait(60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.exit_code, 0) << "step 1's rank joined step 0's job:\n" << r.out << r.err;
  EXPECT_NE(r.err.find("belongs to Slurm job step 10068.0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("runs in step 10068.1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("MASTER_PORT"), std::string::npos) << r.err;
  // Step 0's own rank 1 joins as before.
  BackgroundProcess step0_rank1({bin("launch_test_worker"), "allreduce"},
                                srun_task_env("0", 1, port.port()));
  const auto own = step0_rank1.wait(60);
  EXPECT_EQ(own.exit_code, 0) << own.err;
  EXPECT_EQ(step0_rank0.wait(60).exit_code, 0);
}

}  // namespace
}  // namespace tandem
