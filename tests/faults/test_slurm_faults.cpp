// What Slurm does to a job, without Slurm: the environment srun gives a
// task, and the signals Slurm sends, reproduced on one machine with real
// processes. The same situations under a real Slurm are in tests/slurm/.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "support/launch_testing.h"
#include "support/reserved_port.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::file_exists;
using testing::launch;
using testing::none_alive;
using testing::ProcessResult;
using testing::ReservedPort;
using testing::TempDir;
using testing::wait_for_pids;

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

// A worker that, on SIGTERM or SIGINT, writes DIR/stopping<RANK>, takes a
// moment (its checkpoint), then writes DIR/saved<RANK> and exits 75, as a
// preemption save does.
std::string slow_saving_worker(const TempDir& dir) {
  const std::string path = dir.path() + "/slow_saver.sh";
  std::ofstream(path) << "#!/bin/sh\n"
                         "D=\"$TANDEM_TEST_PID_DIR\"\n"
                         "trap 'touch \"$D/stopping$RANK\"; sleep 1; "
                         "touch \"$D/saved$RANK\"; exit 75' TERM INT\n"
                         "echo $$ > \"$D/rank$RANK.pid.tmp\"; mv \"$D/rank$RANK.pid.tmp\" "
                         "\"$D/rank$RANK.pid\"\n"
                         "while :; do sleep 0.05; done\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

bool both_stopping(const TempDir& dir) {
  return testing::wait_for_files(dir.path(), [&] {
    return file_exists(dir.path() + "/stopping0") && file_exists(dir.path() + "/stopping1");
  }, 30);
}

// At a time limit or scancel, a launcher that srun started gets SIGTERM
// twice: from slurmstepd, and from srun forwarding its own (jobs 10060 and
// 10062). The repeat must not be taken for a second Ctrl-C: the workers keep
// their grace period and save.
// Two slow-saving workers under a launcher in Slurm job 10060, sent `sig`
// twice: the repeat once the first has reached the workers (two signals
// sent at once may be delivered as one). Returns the launcher's result.
ProcessResult signal_twice_in_a_slurm_job(const TempDir& dir, int sig,
                                          std::vector<pid_t>* pids) {
  BackgroundProcess p(launch({"--nproc-per-node", "2", "--standalone", slow_saving_worker(dir)}),
                      {"TANDEM_TEST_PID_DIR=" + dir.path(), "SLURM_JOB_ID=10060"});
  *pids = wait_for_pids(dir.path(), 2);
  EXPECT_EQ(pids->size(), 2u) << "workers did not start";
  p.send(sig);
  EXPECT_TRUE(both_stopping(dir));
  p.send(sig);
  return p.wait(30);
}

TEST(SlurmFaults, ASigtermRepeatedInASlurmJobLetsTheWorkersFinishSaving) {
  TempDir dir;
  std::vector<pid_t> pids;
  const auto r = signal_twice_in_a_slurm_job(dir, SIGTERM, &pids);
  ASSERT_FALSE(r.timed_out);
  // The workers stopped for preemption, and the launcher says so (75).
  EXPECT_EQ(r.exit_code, 75) << r.err;
  EXPECT_TRUE(file_exists(dir.path() + "/saved0")) << "rank 0 was killed before it saved\n"
                                                   << r.err;
  EXPECT_TRUE(file_exists(dir.path() + "/saved1")) << "rank 1 was killed before it saved\n"
                                                   << r.err;
  EXPECT_TRUE(none_alive(pids, 1.0));
}

// Ctrl-C twice still means "stop now", in a Slurm job too (srun forwards
// SIGINT from an interactive user).
TEST(SlurmFaults, ASecondSigintInASlurmJobStillStopsTheWorkersAtOnce) {
  TempDir dir;
  std::vector<pid_t> pids;
  const auto r = signal_twice_in_a_slurm_job(dir, SIGINT, &pids);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_FALSE(file_exists(dir.path() + "/saved0")) << r.err;
  EXPECT_FALSE(file_exists(dir.path() + "/saved1")) << r.err;
  EXPECT_TRUE(none_alive(pids, 1.0));
}

// A stand-in for scontrol that says job 10070 was started by srun (no
// sbatch: BatchFlag=0), refuses a requeue as Slurm does, and notes in
// DIR/requeued that one was asked for.
std::string fake_scontrol(const TempDir& dir) {
  const std::string path = dir.path() + "/scontrol";
  std::ofstream(path) << "#!/bin/sh\n"
                         "if [ \"$1\" = show ]; then\n"
                         "  echo \"JobId=10070 JobName=train UserId=u(1) Restarts=0 BatchFlag=0 "
                         "Reboot=0 ExitCode=0:0\"; exit 0\n"
                         "fi\n"
                         "if [ \"$1\" = requeue ]; then\n"
                         "  touch \"$(dirname \"$0\")/requeued\"\n"
                         "  echo 'Requeue of JobId=10070 returned an error: Only batch jobs are "
                         "accepted or processed' >&2; exit 1\n"
                         "fi\n"
                         "exit 2\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

// `requeue: auto` in a job srun started interactively: Slurm cannot requeue
// it, so the program says the checkpoint is saved and to start the job
// again, without trying the requeue or telling the user to do it by hand.
TEST(SlurmFaults, RequeueAutoInAJobSrunStartedSaysToStartItAgainInsteadOfRequeuing) {
  TempDir dir;
  fake_scontrol(dir);
  const std::string ckpt = dir.path() + "/ckpt";
  const std::string config = dir.path() + "/preempt.yaml";
  std::ofstream(config) << "preemption:\n  enabled: true\n  checkpoint_dir: " << ckpt
                        << "\n  signals: [USR1, TERM]\n  requeue: auto\n";
  BackgroundProcess p({bin("quickstart_worker"), "400", "8", dir.path() + "/out.safetensors"},
                      {"SLURM_JOB_ID=10070", "TANDEM_CONFIG_FILE=" + config,
                       "TANDEM_TEST_STEP_DELAY_MS=20",
                       "PATH=" + dir.path() + ":" + std::string(std::getenv("PATH"))});
  const std::string out_dir = p.out_path().substr(0, p.out_path().rfind('/'));
  ASSERT_TRUE(testing::wait_for_files(
      out_dir, [&] { return testing::read_file(p.out_path()).find("step 2") != std::string::npos; },
      60))
      << testing::read_file(p.err_path());
  p.send(SIGUSR1);
  const auto r = p.wait(60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 75) << r.err;
  const std::string said = r.out + r.err;
  EXPECT_NE(said.find("with a checkpoint in " + ckpt), std::string::npos) << said;
  EXPECT_NE(said.find("Slurm job 10070 was started by srun or salloc, not sbatch"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("start it again to resume from " + ckpt), std::string::npos) << said;
  EXPECT_EQ(said.find("requeuing Slurm job"), std::string::npos) << said;
  EXPECT_EQ(said.find("requeue the job yourself"), std::string::npos) << said;
  EXPECT_FALSE(file_exists(dir.path() + "/requeued")) << "scontrol requeue was run";
}

}  // namespace
}  // namespace tandem
