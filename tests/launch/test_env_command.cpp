// `tandem env`, end to end.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "env/system_probe.h"
#include "tandem/amp/cross_entropy.h"
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
  for (const char* key : {"versions", "backends", "cuda", "libtorch", "platform", "cpu",
                          "threads", "blas", "rank_env", "config", "warnings"}) {
    EXPECT_TRUE(report.contains(key)) << key;
  }
  // What a bug report needs of the machine, as accelerate env's Platform line.
  const auto& platform = report["platform"];
  EXPECT_NE(platform["kernel"].get<std::string>().find("Linux"), std::string::npos)
      << platform.dump();
  EXPECT_EQ(platform["libc"].get<std::string>().rfind("glibc 2.", 0), 0u) << platform.dump();
  EXPECT_GT(platform["memory_bytes"].get<int64_t>(), int64_t{1} << 30) << platform.dump();
  EXPECT_FALSE(platform["os"].get<std::string>().empty()) << platform.dump();
  EXPECT_EQ(report["backends"]["gloo"], true);
  EXPECT_EQ(report["backends"]["tandem_cuda_kernels"], built_with_cuda_kernels());
  EXPECT_EQ(report["versions"]["libtorch"].get<std::string>().substr(0, 1),
            std::to_string(TORCH_VERSION_MAJOR));
  EXPECT_TRUE(report["cpu"]["flags"].contains("avx2"));
  EXPECT_FALSE(report["blas"]["vendor"].is_null());
}

std::string compiled_torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

TEST(EnvCommand, JsonNamesTheLoadedLibTorchItsBuildAndAbi) {
  auto versions = env_json()["versions"];
  // The LibTorch loaded is the one the tests were compiled against.
  EXPECT_EQ(versions["libtorch"], compiled_torch_version());
  EXPECT_EQ(versions["libtorch_built_against"], compiled_torch_version());
  ASSERT_TRUE(versions["libtorch_library"].is_string());
  EXPECT_NE(versions["libtorch_library"].get<std::string>().find("libtorch_cpu"),
            std::string::npos);
  EXPECT_EQ(versions["libtorch_cxx_abi"], _GLIBCXX_USE_CXX11_ABI ? "cxx11" : "pre-cxx11");
  EXPECT_EQ(versions["cxx_abi"], versions["libtorch_cxx_abi"]);
  for (const char* key : {"cuda", "cudnn", "nccl"}) {
    EXPECT_TRUE(versions.contains(key)) << key;
  }
#if !defined(TANDEM_WITH_NCCL)
  EXPECT_TRUE(versions["nccl"].is_null());
#endif
}

TEST(EnvCommand, SaysWhenBf16IsEmulatedOnThisCpuWithTheFactorAndTheRemedy) {
  // A cap below bf16 makes any CPU emulate it, as an AVX2-only one does.
  auto report = env_json({"ONEDNN_MAX_CPU_ISA=AVX2"});
  const auto& bf16 = report["cpu"]["bf16"];
  ASSERT_TRUE(bf16.is_object()) << report["cpu"].dump();
  EXPECT_FALSE(bf16["native"].get<bool>());
  EXPECT_GT(bf16["bf16_over_fp32_matmul_time"].get<double>(), 0.0);
  bool warned = false;
  for (const auto& warning : report["warnings"]) {
    const auto text = warning.get<std::string>();
    if (text.find("without native bf16") == std::string::npos) continue;
    warned = true;
    EXPECT_NE(text.find("x its fp32 time here"), std::string::npos) << text;
    EXPECT_NE(text.find("Train in fp32 on this CPU"), std::string::npos) << text;
  }
  EXPECT_TRUE(warned) << report["warnings"].dump();
}

TEST(EnvCommand, WarnsWhenTheLoadedLibTorchIsNotTheOneTandemWasBuiltAgainst) {
  cli::SystemReport report;
  report.torch_built_against = "2.13.0";
  report.torch_version = "2.14.1";
  report.torch_library = "/opt/libtorch/lib/libtorch_cpu.so";
  report.cxx_abi = "cxx11";
  report.torch_cxx_abi = "pre-cxx11";
  const auto warnings = cli::report_warnings(report);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("built against LibTorch 2.13.0 but is running with LibTorch 2.14.1 "
                             "(/opt/libtorch/lib/libtorch_cpu.so)"),
            std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[1].find("cxx11 std::string ABI but LibTorch uses pre-cxx11"),
            std::string::npos)
      << warnings[1];

  report.torch_version = "2.13.0";
  report.torch_cxx_abi = "cxx11";
  EXPECT_TRUE(cli::report_warnings(report).empty());
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
  auto report = env_json({"XDG_CACHE_HOME=" + cache.path(), "HF_HOME="});
  EXPECT_EQ(report["config"]["source"], "tandem");
  EXPECT_EQ(report["config"]["file"], cache.path() + "/tandem/default_config.yaml");
  EXPECT_EQ(report["config"]["searched"],
            nlohmann::json::array({cache.path() + "/tandem/default_config.yaml",
                                   cache.path() + "/huggingface/accelerate/default_config.yaml"}));
}

// TANDEM_CONFIG_FILE comes before the default files, as select_config_file()
// has it for tandem launch and its workers' Accelerator.
TEST(EnvCommand, ReportsTheFileTandemConfigFileNamesBeforeTheDefaults) {
  TempDir cache;
  const std::string chosen = cache.path() + "/chosen.yaml";
  (void)!std::system(("mkdir -p " + cache.path() + "/tandem && touch " + cache.path() +
                      "/tandem/default_config.yaml " + chosen)
                         .c_str());
  auto report = env_json({"XDG_CACHE_HOME=" + cache.path(), "TANDEM_CONFIG_FILE=" + chosen});
  EXPECT_EQ(report["config"]["source"], "TANDEM_CONFIG_FILE");
  EXPECT_EQ(report["config"]["file"], chosen);
  EXPECT_EQ(report["config"]["searched"], nlohmann::json::array({chosen}));
  EXPECT_EQ(report["warnings"].dump().find("TANDEM_CONFIG_FILE"), std::string::npos)
      << report["warnings"];

  auto text = run_process({bin("tandem"), "env"}, 60,
                          {"XDG_CACHE_HOME=" + cache.path(), "TANDEM_CONFIG_FILE=" + chosen});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find(chosen + " (TANDEM_CONFIG_FILE)"), std::string::npos) << text.out;

  // A path that is not a file is still the one in effect, with a warning.
  const std::string missing = cache.path() + "/nope.yaml";
  auto gone = env_json({"XDG_CACHE_HOME=" + cache.path(), "TANDEM_CONFIG_FILE=" + missing});
  EXPECT_EQ(gone["config"]["file"], missing);
  EXPECT_NE(gone["warnings"].dump().find("TANDEM_CONFIG_FILE=" + missing + " is not a file"),
            std::string::npos)
      << gone["warnings"];

  // Another malformed TANDEM_* variable is reported, not fatal.
  auto bad = env_json({"XDG_CACHE_HOME=" + cache.path(), "TANDEM_CONFIG_FILE=" + chosen,
                       "TANDEM_MIXED_PRECISION=fp32"});
  EXPECT_EQ(bad["config"]["file"], chosen);
  EXPECT_NE(bad["warnings"].dump().find("TANDEM_MIXED_PRECISION"), std::string::npos)
      << bad["warnings"];
}

TEST(EnvCommand, TextReportNamesTheBlasAndUnknownFlagsAreUsageErrors) {
  auto text = run_process({bin("tandem"), "env"}, 60);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("blas in use"), std::string::npos) << text.out;
  EXPECT_EQ(run_process({bin("tandem"), "env", "--bogus"}, 30).exit_code, 2);
}

}  // namespace
}  // namespace tandem
