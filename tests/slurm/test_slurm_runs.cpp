// Training under a real Slurm (tests/support/slurm_cluster.h: slurmctld,
// slurmd per host, munge, each host a network namespace): srun starting
// every worker, srun starting one `tandem launch` per node, the launch
// Slurm would split into separate jobs, and examples/slurm/train.sbatch
// end to end. Each run trains the README quickstart's model on a fixed
// global batch and must end where one process ends (1e-5 relative).

#include <gtest/gtest.h>

#include <unistd.h>

#include <string>
#include <vector>

#include "multinode/hostfile_cluster.h"
#include "support/slurm_cluster.h"
#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::BackgroundProcess;
using testing::max_relative_diff;
using testing::read_file;
using testing::run_process;
using testing::SlurmCluster;

const std::string kToken = "TANDEM_STORE_TOKEN=" + std::string(64, 'e');
constexpr const char* kSteps = "30";
constexpr const char* kGlobalBatch = "24";

// The quickstart model trained by one process: the reference.
std::string one_process(const std::string& dir) {
  const std::string path = dir + "/one.safetensors";
  auto r = run_process({bin("quickstart_worker"), kSteps, kGlobalBatch, path}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return path;
}

std::vector<std::string> worker(const std::string& out) {
  return {bin("quickstart_worker"), kSteps, kGlobalBatch, out};
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// srun starts every worker itself: ranks, local ranks and the master come
// from the step, the port from the job and step id.
void srun_direct(int hosts, int tasks_per_node) {
  SlurmCluster slurm(hosts);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  const std::string many = slurm.shared() + "/many.safetensors";
  auto r = run_process(
      slurm.login(cat({"srun", "-N", std::to_string(hosts),
                       "--ntasks-per-node=" + std::to_string(tasks_per_node),
                       "--kill-on-bad-exit=1"},
                      worker(many))),
      240, {kToken, "TANDEM_TIMEOUT_S=60"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << slurm.diagnostics();
  const std::string world = std::to_string(hosts * tasks_per_node);
  EXPECT_NE(r.out.find("{\"world\": " + world + ", \"steps\": 30"), std::string::npos) << r.out;
  EXPECT_LE(max_relative_diff(many, one_process(slurm.shared())), 1e-5)
      << hosts << " hosts x " << tasks_per_node << " srun tasks against one process";
}

TEST(Slurm, SrunStartsTwoTasksOnEachOfTwoHostsAsOneWorldOfFour) { srun_direct(2, 2); }

TEST(Slurm, SrunStartsOneTaskOnEachOfThreeHostsAsOneWorldOfThree) { srun_direct(3, 1); }

// Each srun task's place on its node (SLURM_LOCALID, its node's entry of
// SLURM_STEP_TASKS_PER_NODE: 2 tasks on n0, 1 on n1 here) and its threads
// (--cpus-per-task, unless OMP_NUM_THREADS says otherwise). Needs a
// machine with 2 cores or more to tell the two apart.
TEST(Slurm, SrunTasksTakeTheirLocalRankAndCpusPerTaskThreads) {
  SlurmCluster slurm(2);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  auto r = run_process(slurm.login({"srun", "-n3", "--distribution=block", "-w", "n0,n1",
                                    "--ntasks-per-node=2", "--cpus-per-task=1",
                                    "--kill-on-bad-exit=1", bin("launch_test_worker"),
                                    "allreduce"}),
                       120, {kToken, "TANDEM_TIMEOUT_S=60"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << slurm.diagnostics();
  for (const std::string line :
       {"rank 0/3 allreduce ok sum=6 source=slurm local=0/2 threads=1",
        "rank 1/3 allreduce ok sum=6 source=slurm local=1/2 threads=1",
        "rank 2/3 allreduce ok sum=6 source=slurm local=0/1 threads=1"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
  // (LibTorch's own default here would be the machine's cores.)
  auto told = run_process(slurm.login({"srun", "-N1", "-n1", "--cpus-per-task=1",
                                       bin("launch_test_worker"), "allreduce"}),
                          60, {"OMP_NUM_THREADS=2"});
  EXPECT_NE(told.out.find("threads=2"), std::string::npos) << told.out << told.err;
}

TEST(Slurm, OneLauncherPerNodeUnderSrunIsOneJob) {
  SlurmCluster slurm(2);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  const std::string many = slurm.shared() + "/many.safetensors";
  auto r = run_process(
      slurm.login(cat({"srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", bin("tandem"),
                       "launch", "--nproc-per-node", "2"},
                      worker(many))),
      240, {kToken, "TANDEM_TIMEOUT_S=60"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << slurm.diagnostics();
  // Each launcher said what it took from Slurm; one world of 4 trained.
  for (const std::string node : {"node 0 of 2", "node 1 of 2"}) {
    EXPECT_NE(r.err.find(node), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find("--master-addr n0"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("{\"world\": 4, \"steps\": 30"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"world\": 2"), std::string::npos) << "two separate jobs:\n" << r.out;
  EXPECT_LE(max_relative_diff(many, one_process(slurm.shared())), 1e-5);
}

TEST(Slurm, SeveralLaunchersOnANodeAreAnErrorNotSeveralJobs) {
  SlurmCluster slurm(2);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  const std::string many = slurm.shared() + "/many.safetensors";
  auto r = run_process(
      slurm.login(cat({"srun", "-N2", "--ntasks-per-node=2", bin("tandem"), "launch",
                       "--nproc-per-node", "2"},
                      worker(many))),
      120, {kToken});
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("srun started 2 tasks on this node"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("srun --ntasks-per-node=1 tandem launch"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("\"world\""), std::string::npos) << "something trained:\n" << r.out;
  EXPECT_NE(::access(many.c_str(), F_OK), 0) << "the refused launch wrote " << many;
}

}  // namespace
}  // namespace tandem
