// Python programs under `tandem launch`: a plain torch.distributed script
// (init_process_group("gloo") from the environment) runs as under torchrun,
// with its rendezvous store on loopback, on 2 and 3 ranks, and restarts with
// a fresh store.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/launch_testing.h"
#include "support/subprocess.h"

namespace tandem {
namespace python_programs_test {

using testing::launch;
using testing::run_process;

std::string script(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/launch/python/" + name;
}

bool peer_has_torch() {
  return run_process({TANDEM_PEER_PYTHON, "-c", "import torch.distributed"}, 60).exit_code == 0;
}

TEST(PythonUnderLaunch, APlainTorchDistributedScriptRunsAsUnderTorchrun) {
  if (!peer_has_torch()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " cannot import torch";
  for (int ranks : {2, 3}) {
    auto ours = run_process(
        launch({"--nproc-per-node", std::to_string(ranks), TANDEM_PEER_PYTHON, script("allreduce.py")}),
        180);
    ASSERT_EQ(ours.exit_code, 0) << ours.out << ours.err;
    auto theirs = run_process({TANDEM_PEER_PYTHON, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", std::to_string(ranks), script("allreduce.py")},
                              180);
    ASSERT_EQ(theirs.exit_code, 0) << theirs.out << theirs.err;
    const double sum = ranks * (ranks + 1) / 2.0;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string line = "rank " + std::to_string(rank) + "/" + std::to_string(ranks) +
                               " sum " + std::to_string(sum).substr(0, 3);
      EXPECT_NE(ours.out.find(line), std::string::npos) << line << "\n" << ours.out << ours.err;
      EXPECT_NE(theirs.out.find(line), std::string::npos) << line << "\n" << theirs.out;
    }
    // tandem's launcher keeps the store on loopback for a single node.
    EXPECT_NE(ours.out.find("store listens on 127.0.0.1\n"), std::string::npos) << ours.out;
  }
}

TEST(PythonUnderLaunch, ARestartedGroupRendezvousesAgainWithAFreshStore) {
  if (!peer_has_torch()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " cannot import torch";
  auto r = run_process(launch({"--nproc-per-node", "3", "--max-restarts", "1", TANDEM_PEER_PYTHON,
                               script("restart.py")}),
                       180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 0 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string line = "attempt 1 rank " + std::to_string(rank) + " sum 6.0";
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

}  // namespace python_programs_test
}  // namespace tandem
