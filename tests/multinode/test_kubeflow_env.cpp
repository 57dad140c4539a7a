// Kubeflow's PyTorchJob, as the environments its training operator gives
// each pod (each pod a host of a TestCluster): without an elastic policy
// every pod is one process with torchrun's RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT; with one, every pod runs a launcher configured through
// torchrun's PET_* variables (PET_NNODES, PET_NPROC_PER_NODE,
// PET_RDZV_BACKEND, PET_RDZV_ENDPOINT, PET_RDZV_ID). Either way the job
// must end where one process ends (1e-5 relative).

#include <gtest/gtest.h>

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
using testing::run_process;
using testing::ScratchDir;
using testing::TestCluster;

const std::string kPodToken = "TANDEM_STORE_TOKEN=" + std::string(64, 'k');

std::string one_pod_process(const ScratchDir& dir) {
  const std::string path = dir / "one.safetensors";
  auto r = run_process({bin("quickstart_worker"), "30", "24", path}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return path;
}

// Starts `argv` on every pod with that pod's environment; returns every
// pod's output after all exit 0.
std::string run_pods(TestCluster& cluster, const std::vector<std::string>& argv,
                     const std::function<std::vector<std::string>(int)>& env_of_pod) {
  std::vector<std::unique_ptr<BackgroundProcess>> pods;
  for (int pod = 0; pod < cluster.size(); ++pod) {
    pods.push_back(std::make_unique<BackgroundProcess>(cluster.on(pod, argv), env_of_pod(pod)));
  }
  std::string out;
  for (int pod = 0; pod < cluster.size(); ++pod) {
    auto r = pods[pod]->wait(180);
    EXPECT_EQ(r.exit_code, 0) << "pod " << pod << ":\n" << r.out << r.err;
    out += r.out + r.err;
  }
  return out;
}

TEST(KubeflowPyTorchJob, EachPodOneProcessWithTorchrunsVariables) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  ScratchDir dir;
  const std::string many = dir / "many.safetensors";
  const std::string out = run_pods(
      cluster, {bin("quickstart_worker"), "30", "24", many}, [&](int pod) {
        return std::vector<std::string>{"RANK=" + std::to_string(pod), "WORLD_SIZE=2",
                                        "MASTER_ADDR=" + cluster.address(0), "MASTER_PORT=29681",
                                        kPodToken, "TANDEM_TIMEOUT_S=60"};
      });
  EXPECT_NE(out.find("{\"world\": 2, \"steps\": 30"), std::string::npos) << out;
  EXPECT_LE(max_relative_diff(many, one_pod_process(dir)), 1e-5);
}

TEST(KubeflowPyTorchJob, ElasticPodsRunALauncherConfiguredByPetVariables) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  ScratchDir dir;
  const std::string many = dir / "many.safetensors";
  const std::string out = run_pods(
      cluster, {bin("tandem"), "launch", bin("quickstart_worker"), "30", "24", many},
      [&](int) {
        return std::vector<std::string>{"PET_NNODES=2", "PET_NPROC_PER_NODE=2",
                                        "PET_RDZV_BACKEND=c10d",
                                        "PET_RDZV_ENDPOINT=" + cluster.address(0) + ":29683",
                                        "PET_RDZV_ID=pytorchjob-7", kPodToken, "TANDEM_TIMEOUT_S=60"};
      });
  EXPECT_NE(out.find("{\"world\": 4, \"steps\": 30"), std::string::npos) << out;
  EXPECT_LE(max_relative_diff(many, one_pod_process(dir)), 1e-5);
}

}  // namespace
}  // namespace tandem
