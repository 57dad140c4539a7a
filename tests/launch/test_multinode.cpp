// Multi-node launches that need no cluster, and foreign launchers (mpirun
// stands in for them). The runs across hosts are in tests/multinode.

#include <gtest/gtest.h>

#include <cstdlib>

#include "support/reserved_port.h"
#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::run_process;

bool sh(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

TEST(MultiNode, LaunchWithoutAStoreTokenStopsBeforeAnyWorkerAndSaysHowToMakeOne) {
  ::unsetenv("TANDEM_STORE_TOKEN");  // the launcher inherits this process's environment
  auto r = run_process({bin("tandem"), "launch", "--nnodes", "2", "--node-rank", "1",
                        "--nproc-per-node", "1", "--master-addr", "10.231.7.1", "--master-port",
                        "29633", bin("launch_test_worker"), "allreduce"},
                       20);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("needs TANDEM_STORE_TOKEN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("head -c 32 /dev/urandom"), std::string::npos) << r.err;
}

TEST(ForeignLauncher, MpirunStartsAWorkingJob) {
  if (!sh("command -v mpirun")) GTEST_SKIP() << "skipped: mpirun (openmpi-bin) is not installed";
  // Rank 0 hosts the store on MASTER_PORT: a port held free for this test,
  // not a fixed number another job on the machine might be using.
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  auto r = run_process({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                        "MASTER_ADDR=127.0.0.1", "-x",
                        "MASTER_PORT=" + std::to_string(reserved.port()),
                        bin("launch_test_worker"), "allreduce"},
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0/2 allreduce ok sum=3 source=openmpi"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1/2 allreduce ok sum=3 source=openmpi"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem
