// Open MPI's mpirun across hosts (each a network namespace of a TestCluster,
// reached over its ssh): every rank reads OMPI_COMM_WORLD_* and the master
// the job exports (-x MASTER_ADDR -x MASTER_PORT), and the job must end
// where one process ends (1e-5 relative).

#include <gtest/gtest.h>

#include <unistd.h>

#include <string>
#include <vector>

#include "multinode/hostfile_cluster.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "support/test_cluster.h"

namespace tandem {
namespace {

using testing::bin;
using testing::max_relative_diff;
using testing::run_process;
using testing::ScratchDir;
using testing::TestCluster;

TEST(MpirunHosts, TwoHostsOfTwoRanksOverSshAreOneWorld) {
  if (::access("/usr/bin/mpirun", X_OK) != 0) {
    GTEST_SKIP() << "skipped: no mpirun (Debian's openmpi-bin; scripts/setup.sh installs it)";
  }
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string no_ssh = cluster.start_ssh();
  if (!no_ssh.empty()) GTEST_SKIP() << "skipped: " << no_ssh;
  ScratchDir dir;
  const std::string many = dir / "many.safetensors";
  const std::string one = dir / "one.safetensors";
  auto r = run_process(
      cluster.on(0, {"mpirun", "--allow-run-as-root", "-np", "4", "-H",
                     cluster.address(0) + ":2," + cluster.address(1) + ":2", "--mca",
                     "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
                     "-i " + cluster.ssh_dir() + "/client_key -o BatchMode=yes -o "
                     "StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                     "-x", "MASTER_ADDR=" + cluster.address(0), "-x", "MASTER_PORT=29693", "-x",
                     "TANDEM_STORE_TOKEN=" + std::string(64, 'm'), "-x", "TANDEM_TIMEOUT_S=60",
                     bin("quickstart_worker"), "30", "24", many}),
      240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("{\"world\": 4, \"steps\": 30"), std::string::npos) << r.out;
  auto alone = run_process({bin("quickstart_worker"), "30", "24", one}, 120);
  ASSERT_EQ(alone.exit_code, 0) << alone.out << alone.err;
  EXPECT_LE(max_relative_diff(many, one), 1e-5);
}

}  // namespace
}  // namespace tandem
