// save_on_each_node across hosts that share no file system: 2 hosts x 2
// ranks of `tandem launch`, each host a network namespace in which the
// checkpoint directory is a bind mount of that host's own folder
// (dir/host<i>), so that every host sees only what it wrote. The README
// quickstart's model trains 30 steps saving every 10; then both hosts are
// rolled back to step 20 and the job resumes, each host from its own copy,
// and must end where the straight run ended. Under DDP (each host's local
// main keeps the whole model: a host's copy alone merges) and under ZeRO-3
// (the ranks' shards stay on their hosts: a host's copy alone cannot be
// merged, and says why).

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "multinode/hostfile_cluster.h"
#include "multinode/static_job.h"
#include "support/scratch_dir.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

using testing::bin;
using testing::ScratchDir;
using testing::TestCluster;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The straight run and the resumed one, on `cluster`, each host's CKPT its
// own folder; `launch_args` picks the strategy. Returns the relative
// difference of their final weights; fills `dir` with both hosts' folders.
double resume_from_each_hosts_copy(TestCluster& cluster, const ScratchDir& dir,
                                   const std::string& port,
                                   const std::vector<std::string>& launch_args,
                                   std::vector<std::string> env) {
  const std::string ckpt = dir / "ckpt";
  fs::create_directories(ckpt);
  for (int host = 0; host < cluster.size(); ++host) {
    fs::create_directories(dir / ("host" + std::to_string(host)));
  }
  // Inside each host's namespace (its own mount namespace, a slave of the
  // machine's: nothing propagates out), CKPT is that host's folder.
  auto own_folder = [&](int host) {
    return std::vector<std::string>{"sh", "-c", "mount --bind \"$1\" \"$2\" && shift 2 && exec \"$@\"",
                                    "sh", dir / ("host" + std::to_string(host)), ckpt};
  };
  env.insert(env.end(), {"TANDEM_TIMEOUT_S=60", "TANDEM_TEST_SAVE_ON_EACH_NODE=1"});
  testing::run_static_job(cluster, 2, port, launch_args,
                          {bin("quickstart_worker"), "30", "24", dir / "straight.safetensors",
                           ckpt, "10"},
                          env, 240, own_folder);
  // Both hosts committed every tag with their own ranks' files only.
  for (int host = 0; host < cluster.size(); ++host) {
    const std::string mine = dir / ("host" + std::to_string(host));
    EXPECT_EQ(slurp(mine + "/latest"), "global_step30\n") << "host " << host;
    for (int rank = 0; rank < 4; ++rank) {
      const bool here = rank / 2 == host;
      EXPECT_EQ(fs::is_regular_file(mine + "/global_step20/rank_0000" + std::to_string(rank) +
                                    ".safetensors"),
                here)
          << "host " << host << ", rank " << rank;
    }
    EXPECT_TRUE(read_checkpoint_meta(mine + "/global_step20").value("save_on_each_node", false));
  }
  EXPECT_EQ(slurp(dir / "host0/global_step20/meta.json"),
            slurp(dir / "host1/global_step20/meta.json"));
  EXPECT_FALSE(fs::exists(ckpt + "/latest")) << "the mounts leaked out of the hosts";
  // Back to step 20 on both hosts; the job resumes from each host's copy.
  for (int host = 0; host < cluster.size(); ++host) {
    const std::string mine = dir / ("host" + std::to_string(host));
    fs::remove_all(mine + "/global_step30");
    std::ofstream(mine + "/latest") << "global_step20\n";
  }
  const std::string out = testing::run_static_job(
      cluster, 2, port, launch_args,
      {bin("quickstart_worker"), "30", "24", dir / "resumed.safetensors", ckpt, "10"}, env, 240,
      own_folder);
  EXPECT_NE(out.find("resumed at step 20 on 4 ranks"), std::string::npos) << out;
  return testing::max_relative_diff(dir / "resumed.safetensors", dir / "straight.safetensors");
}

TEST(SaveOnEachNode, DdpResumesOnEveryHostFromItsOwnCopy) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: no namespace cluster (" << cluster.why() << ")";
  ScratchDir dir;
  EXPECT_LE(resume_from_each_hosts_copy(cluster, dir, "29721", {}, {}), 1e-6);
  // Host 1's local main (rank 2) wrote the whole model there too, so that
  // host's copy alone merges.
  const auto merged = testing::run_process(
      {bin("tandem"), "checkpoint", "merge", dir / "host1", dir / "merged.safetensors"}, 60);
  EXPECT_EQ(merged.exit_code, 0) << merged.out << merged.err;
}

TEST(SaveOnEachNode, Zero3ResumesOnEveryHostAndAHostsCopyAloneSaysWhatItLacks) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: no namespace cluster (" << cluster.why() << ")";
  ScratchDir dir;
  const std::string config = dir / "zero3.json";
  std::ofstream(config) << R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3}})";
  EXPECT_LE(resume_from_each_hosts_copy(cluster, dir, "29723", {"--config-file", config},
                                        {"TANDEM_TEST_SHARDED=1"}),
            1e-6);
  const auto merged = testing::run_process(
      {bin("tandem"), "checkpoint", "merge", dir / "host1", dir / "merged.safetensors"}, 60);
  EXPECT_NE(merged.exit_code, 0);
  EXPECT_NE(merged.err.find("saved with save_on_each_node, and this host's copy lacks "
                            "rank_00000.safetensors, rank_00001.safetensors"),
            std::string::npos)
      << merged.err;
}

}  // namespace
}  // namespace tandem
