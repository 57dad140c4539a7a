// `tandem env`, end to end.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::bin;
using testing::run_process;
using testing::TempDir;

nlohmann::json env_json(const std::vector<std::string>& extra_env = {}) {
  auto r = run_process({bin("tandem"), "env", "--json"}, 60, extra_env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(EnvCommand, JsonReportsEverySection) {
  auto report = env_json();
  for (const char* key : {"versions", "backends", "cuda", "libtorch", "cpu", "threads", "blas",
                          "rank_env", "config", "warnings"}) {
    EXPECT_TRUE(report.contains(key)) << key;
  }
  EXPECT_EQ(report["backends"]["gloo"], true);
  EXPECT_EQ(report["versions"]["libtorch"].get<std::string>().substr(0, 1),
            std::to_string(TORCH_VERSION_MAJOR));
  EXPECT_TRUE(report["cpu"]["flags"].contains("avx2"));
  EXPECT_FALSE(report["blas"]["vendor"].is_null());
}

TEST(EnvCommand, ReportsTheRankEnvironmentAndSurvivesABadOne) {
  auto good = env_json({"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "MASTER_PORT=1234"});
  EXPECT_EQ(good["rank_env"]["source"], "torchrun");
  EXPECT_EQ(good["rank_env"]["rank"], 1);
  EXPECT_EQ(good["rank_env"]["world_size"], 4);
  EXPECT_EQ(good["rank_env"]["master_port"], 1234);

  auto bad = env_json({"RANK=5", "WORLD_SIZE=2"});
  ASSERT_TRUE(bad["rank_env"]["error"].is_string());
  EXPECT_NE(bad["rank_env"]["error"].get<std::string>().find("RANK=5"), std::string::npos);
}

TEST(EnvCommand, FindsTheDefaultConfigFile) {
  TempDir cache;
  (void)!std::system(("mkdir -p " + cache.path() + "/tandem && touch " + cache.path() +
                      "/tandem/default_config.yaml")
                         .c_str());
  auto report = env_json({"XDG_CACHE_HOME=" + cache.path()});
  EXPECT_EQ(report["config"]["source"], "tandem");
  EXPECT_EQ(report["config"]["file"], cache.path() + "/tandem/default_config.yaml");
}

TEST(EnvCommand, TextReportNamesTheBlasAndUnknownFlagsAreUsageErrors) {
  auto text = run_process({bin("tandem"), "env"}, 60);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("blas in use"), std::string::npos) << text.out;
  EXPECT_EQ(run_process({bin("tandem"), "env", "--bogus"}, 30).exit_code, 2);
}

}  // namespace
}  // namespace tandem
