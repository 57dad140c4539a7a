#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "support/scratch_dir.h"
#include "support/usage_error.h"

#include "tandem/core/error.h"
#include "tandem/core/rank_env.h"

namespace tandem {
namespace {

TEST(RankEnv, NothingSetMeansWorldOfOne) {
  RankEnv env = RankEnv::from_map({});
  EXPECT_FALSE(env.launched());
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
}

TEST(RankEnv, ReadsTheTorchrunContract) {
  RankEnv env = RankEnv::from_map({{"RANK", "5"},
                                   {"LOCAL_RANK", "1"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_WORLD_SIZE", "4"},
                                   {"GROUP_RANK", "1"},
                                   {"MASTER_ADDR", "10.0.0.7"},
                                   {"MASTER_PORT", "1234"},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                   {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(env.source, RankEnvSource::kTorchrun);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.7");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_TRUE(env.agent_store);
  EXPECT_EQ(env.restart_count, 2);
}

TEST(RankEnv, ReadsSlurmWithFirstHostOfTheNodeList) {
  RankEnv env = RankEnv::from_map({{"SLURM_PROCID", "3"},
                                   {"SLURM_LOCALID", "1"},
                                   {"SLURM_NTASKS", "4"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURM_NNODES", "2"},
                                   {"SLURM_JOB_NODELIST", "gpu[07-08],cpu1"}});
  EXPECT_EQ(env.source, RankEnvSource::kSlurm);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "gpu07");
}

TEST(RankEnv, SlurmFirstHostHandlesRangesListsAndPlainNames) {
  EXPECT_EQ(slurm_first_host("node[003-005,9]"), "node003");
  EXPECT_EQ(slurm_first_host("a,b,c"), "a");
  EXPECT_EQ(slurm_first_host("x[2,4],y[1-3]"), "x2");
  EXPECT_EQ(slurm_first_host("solo"), "solo");
}

TEST(RankEnv, ReadsOpenMpiAndMasterFromEnvironment) {
  RankEnv env = RankEnv::from_map({{"OMPI_COMM_WORLD_RANK", "1"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", "29555"}});
  EXPECT_EQ(env.source, RankEnvSource::kOpenMpi);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_port, 29555);
}

TEST(RankEnv, TorchrunWinsOverSlurmWhenBothAreSet) {
  RankEnv env = RankEnv::from_map(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(env.source, RankEnvSource::kTorchrun);
  EXPECT_EQ(env.rank, 0);
}

TEST(RankEnv, ReadsTandemTransportSwitches) {
  RankEnv defaults = RankEnv::from_map({});
  EXPECT_TRUE(defaults.shared_memory);
  EXPECT_EQ(defaults.cuda_backend, "");
  RankEnv env = RankEnv::from_map({{"TANDEM_SHM", "0"},
                                   {"TANDEM_CUDA_BACKEND", "gloo"},
                                   {"GLOO_SOCKET_IFNAME", "eth1"}});
  EXPECT_FALSE(env.shared_memory);
  EXPECT_EQ(env.cuda_backend, "gloo");
  EXPECT_EQ(env.socket_ifname, "eth1");
}

TEST(RankEnv, MalformedValuesNameTheVariable) {
  try {
    RankEnv::from_map({{"RANK", "one"}, {"WORLD_SIZE", "2"}});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='one'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RankEnv::from_map({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), UsageError);
  EXPECT_THROW(RankEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), UsageError);
  EXPECT_THROW(RankEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}),
               UsageError);
}

// TANDEM_STORE_TOKEN_FILE: made once with mode 0600 and read back; a file
// another user could have planted or can read is refused, not trusted.
TEST(StoreTokenFile, IsMadePrivateOnceAndAnythingOthersCouldTouchIsRefused) {
  testing::ScratchDir dir;
  const std::string path = dir.path() + "/token";
  const std::string token = store_token_from_file(path);
  EXPECT_EQ(token.size(), 64u);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(store_token_from_file(path), token);  // every other task reads the same

  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  std::string what = testing::usage_error_message([&] { store_token_from_file(path); });
  EXPECT_NE(what.find("has mode 0644: other users may read or change the job's token. `chmod "
                      "600 "),
            std::string::npos)
      << what;
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);

  const std::string link = dir.path() + "/link";
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  what = testing::usage_error_message([&] { store_token_from_file(link); });
  EXPECT_NE(what.find("is a symbolic link"), std::string::npos) << what;
  const std::string dangling = dir.path() + "/dangling";
  ASSERT_EQ(::symlink((dir.path() + "/nowhere").c_str(), dangling.c_str()), 0);
  what = testing::usage_error_message([&] { store_token_from_file(dangling); });
  EXPECT_NE(what.find("is a symbolic link"), std::string::npos) << what;

  if (::geteuid() == 0) {  // only root can give a file away
    const std::string planted = dir.path() + "/planted";
    std::ofstream(planted) << "attacker-known-token\n";
    ASSERT_EQ(::chmod(planted.c_str(), 0600), 0);
    ASSERT_EQ(::chown(planted.c_str(), 65534, 65534), 0);
    what = testing::usage_error_message([&] { store_token_from_file(planted); });
    EXPECT_NE(what.find("belongs to uid 65534, not to this user (uid 0)"), std::string::npos)
        << what;
  }
}

TEST(RankEnv, AMasterPortThatIsNotAPortSaysTheRange) {
  for (const std::string port : {"abc", "-1", "70000"}) {
    try {
      RankEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", port}});
      FAIL() << port;
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("MASTER_PORT='" + port + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("1-65535"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace tandem
