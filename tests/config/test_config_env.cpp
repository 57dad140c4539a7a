#include <gtest/gtest.h>

#include <cstdlib>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::contains;
using testing::TempFolder;
using testing::usage_error;

TEST(ConfigEnv, ReadsEachVariable) {
  ConfigEnv env = ConfigEnv::from_map({{"TANDEM_CONFIG_FILE", "/etc/run.yaml"},
                                       {"TANDEM_MIXED_PRECISION", "BF16"},
                                       {"TANDEM_GRADIENT_ACCUMULATION_STEPS", "8"},
                                       {"TANDEM_SEED", "18446744073709551615"},
                                       {"XDG_CACHE_HOME", "/cache"},
                                       {"HOME", "/home/ada"},
                                       {"HF_HOME", "/hf"}});
  EXPECT_EQ(env.config_file, "/etc/run.yaml");
  EXPECT_EQ(env.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(env.gradient_accumulation_steps, 8);
  EXPECT_EQ(env.seed, 18446744073709551615ull);
  EXPECT_EQ(env.xdg_cache_home, "/cache");
  EXPECT_EQ(env.home, "/home/ada");
  EXPECT_EQ(env.hf_home, "/hf");
}

TEST(ConfigEnv, EmptyOrAbsentVariablesLeaveFieldsUnset) {
  ConfigEnv env = ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", ""}, {"TANDEM_SEED", ""}});
  EXPECT_FALSE(env.mixed_precision.has_value());
  EXPECT_FALSE(env.seed.has_value());
  EXPECT_FALSE(env.gradient_accumulation_steps.has_value());
  EXPECT_TRUE(env.config_file.empty());
}

TEST(ConfigEnv, MalformedValuesNameTheVariable) {
  EXPECT_TRUE(contains(usage_error([] {
                         ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", "fp32"}});
                       }),
                       "TANDEM_MIXED_PRECISION='fp32' is not valid; set it to no, bf16 or fp16"));
  EXPECT_TRUE(contains(usage_error([] {
                         ConfigEnv::from_map({{"TANDEM_GRADIENT_ACCUMULATION_STEPS", "0"}});
                       }),
                       "TANDEM_GRADIENT_ACCUMULATION_STEPS='0' is not a whole number >= 1"));
  EXPECT_TRUE(contains(usage_error([] {
                         ConfigEnv::from_map({{"TANDEM_GRADIENT_ACCUMULATION_STEPS", "2.5"}});
                       }),
                       "TANDEM_GRADIENT_ACCUMULATION_STEPS='2.5'"));
  EXPECT_TRUE(contains(usage_error([] { ConfigEnv::from_map({{"TANDEM_SEED", "-1"}}); }),
                       "TANDEM_SEED='-1' is not a whole number"));
  EXPECT_TRUE(contains(usage_error([] { ConfigEnv::from_map({{"TANDEM_SEED", "42x"}}); }),
                       "TANDEM_SEED='42x'"));
}

// What `tandem launch --zero_stage/--offload_*_device/--gradient_clipping`
// exports: read, checked, and above the file in resolve_config.
TEST(ConfigEnv, LaunchFlagVariablesBeatTheFile) {
  ConfigEnv env = ConfigEnv::from_map({{"TANDEM_ZERO_STAGE", "3"},
                                       {"TANDEM_OFFLOAD_OPTIMIZER_DEVICE", "cpu"},
                                       {"TANDEM_OFFLOAD_PARAM_DEVICE", "none"},
                                       {"TANDEM_GRADIENT_CLIPPING", "0.5"}});
  Config file;
  file.zero.stage = 1;
  file.zero.offload_param = OffloadDevice::kCpu;
  file.gradient_clipping = 1.0;
  const Config r = resolve_config(file, env, {}, 2);
  EXPECT_EQ(r.zero.stage, 3);
  EXPECT_EQ(r.distributed_type, DistributedType::kDeepSpeed);
  EXPECT_EQ(r.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(r.zero.offload_param, OffloadDevice::kNone);
  EXPECT_EQ(r.gradient_clipping, 0.5);
  EXPECT_TRUE(contains(usage_error([] { ConfigEnv::from_map({{"TANDEM_ZERO_STAGE", "4"}}); }),
                       "TANDEM_ZERO_STAGE='4' is not a ZeRO stage"));
  EXPECT_TRUE(contains(usage_error([] {
                         ConfigEnv::from_map({{"TANDEM_OFFLOAD_PARAM_DEVICE", "nvme"}});
                       }),
                       "TANDEM_OFFLOAD_PARAM_DEVICE='nvme' is not valid; set it to none or cpu"));
  EXPECT_TRUE(contains(usage_error([] {
                         ConfigEnv::from_map({{"TANDEM_GRADIENT_CLIPPING", "-1"}});
                       }),
                       "TANDEM_GRADIENT_CLIPPING='-1'"));
}

// A DeepSpeed JSON's fp16/bf16 block against TANDEM_MIXED_PRECISION (what
// tandem launch --mixed-precision exports) or a code override, as
// Accelerate's DeepSpeedPlugin treats them: the other half type is refused
// naming the block; "no" leaves the block on, with a warning; the same type
// is quiet.
TEST(ConfigEnv, APrecisionOverrideAgainstADeepSpeedBlockIsRefusedOrSaid) {
  const Config fp16 =
      parse_config_text(R"({"fp16": {"enabled": true, "loss_scale_window": 100}})", "ds.json");
  const ConfigEnv bf16_env = ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", "bf16"}});
  const std::string refused = usage_error([&] { resolve_config(fp16, bf16_env, {}, 2); });
  EXPECT_TRUE(contains(refused, "mixed_precision bf16 (from TANDEM_MIXED_PRECISION) disagrees "
                                "with the DeepSpeed config, which enables fp16 at ds.json:1:"))
      << refused;
  ConfigOverrides code;
  code.mixed_precision = MixedPrecision::kFp16;
  const Config bf16 = parse_config_text(R"({"bf16": {"enabled": true}})", "ds.json");
  EXPECT_TRUE(contains(usage_error([&] { resolve_config(bf16, ConfigEnv{}, code, 2); }),
                       "mixed_precision fp16 (from code override) disagrees"));
  const Config kept =
      resolve_config(bf16, ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", "no"}}), {}, 2);
  EXPECT_EQ(kept.mixed_precision, MixedPrecision::kBf16);
  ASSERT_FALSE(kept.warnings.empty());
  EXPECT_TRUE(contains(kept.warnings.back(), "leaves the DeepSpeed config's bf16")) << kept.warnings.back();
  const Config same = resolve_config(bf16, ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", "bf16"}}),
                                     {}, 2);
  EXPECT_EQ(same.mixed_precision, MixedPrecision::kBf16);
  EXPECT_TRUE(same.warnings.empty());
  // A file without a half block takes the override, as before.
  const Config plain = parse_config_text(R"({"train_micro_batch_size_per_gpu": 2})", "ds.json");
  EXPECT_EQ(resolve_config(plain, bf16_env, {}, 2).mixed_precision, MixedPrecision::kBf16);
}

TEST(ConfigEnv, AccumulationStepsAcceptExponentForm) {
  EXPECT_EQ(ConfigEnv::from_map({{"TANDEM_GRADIENT_ACCUMULATION_STEPS", "1e1"}})
                .gradient_accumulation_steps,
            10);
}

TEST(ConfigEnv, FromEnvironmentReadsTheProcessEnvironment) {
  ::setenv("TANDEM_GRADIENT_ACCUMULATION_STEPS", "6", 1);
  ConfigEnv env = ConfigEnv::from_environment();
  ::unsetenv("TANDEM_GRADIENT_ACCUMULATION_STEPS");
  EXPECT_EQ(env.gradient_accumulation_steps, 6);
}

TEST(DefaultConfigPath, PrefersXdgCacheHomeThenHome) {
  ConfigEnv env;
  env.home = "/home/ada";
  EXPECT_EQ(default_config_path(env), "/home/ada/.cache/tandem/default_config.yaml");
  env.xdg_cache_home = "/xdg";
  EXPECT_EQ(default_config_path(env), "/xdg/tandem/default_config.yaml");
  EXPECT_EQ(default_config_path(ConfigEnv{}), "");
}

TEST(FindDefaultConfig, TandemsFileBeatsAcceleratesAndMissingFilesGiveEmpty) {
  TempFolder home;
  ASSERT_FALSE(home.path().empty());
  ConfigEnv env;
  env.home = home.path();
  EXPECT_EQ(find_default_config(env), "");

  std::string accelerate = home.write(".cache/huggingface/accelerate/default_config.yaml");
  EXPECT_EQ(find_default_config(env), accelerate);

  std::string ours = home.write(".cache/tandem/default_config.yaml");
  EXPECT_EQ(find_default_config(env), ours);
}

TEST(FindDefaultConfig, FollowsXdgCacheHomeAndHfHome) {
  TempFolder root;
  ASSERT_FALSE(root.path().empty());
  ConfigEnv env;
  env.home = root.path() + "/home";
  env.xdg_cache_home = root.path() + "/xdg";
  std::string under_xdg = root.write("xdg/huggingface/accelerate/default_config.yaml");
  root.write("home/.cache/huggingface/accelerate/default_config.yaml");
  EXPECT_EQ(find_default_config(env), under_xdg);

  env.hf_home = root.path() + "/hf";
  EXPECT_EQ(find_default_config(env), "");  // HF_HOME replaces the huggingface folder
  std::string under_hf = root.write("hf/accelerate/default_config.yaml");
  EXPECT_EQ(find_default_config(env), under_hf);
}

TEST(SelectConfigFile, FlagBeatsVariableBeatsDefault) {
  TempFolder home;
  ASSERT_FALSE(home.path().empty());
  ConfigEnv env;
  env.home = home.path();
  std::string ours = home.write(".cache/tandem/default_config.yaml");
  EXPECT_EQ(select_config_file("", env), ours);
  env.config_file = "/from/env.yaml";  // returned even though it does not exist
  EXPECT_EQ(select_config_file("", env), "/from/env.yaml");
  EXPECT_EQ(select_config_file("flag.yaml", env), "flag.yaml");
}

TEST(ConfigNames, EnumsPrintAndParse) {
  EXPECT_STREQ(to_string(MixedPrecision::kBf16), "bf16");
  EXPECT_EQ(parse_mixed_precision("FP16"), MixedPrecision::kFp16);
  EXPECT_TRUE(contains(usage_error([] { parse_mixed_precision("half"); }),
                       "use \"no\", \"bf16\" or \"fp16\""));
  EXPECT_STREQ(to_string(DistributedType::kMultiCpu), "MULTI_CPU");
  EXPECT_EQ(parse_distributed_type("deepspeed"), DistributedType::kDeepSpeed);
  EXPECT_EQ(parse_distributed_type("fsdp"), DistributedType::kFsdp);
  EXPECT_STREQ(to_string(DistributedType::kFsdp), "FSDP");
  EXPECT_TRUE(contains(usage_error([] { parse_distributed_type("MEGATRON_LM"); }),
                       "MEGATRON_LM is not supported by tandem"));
  EXPECT_STREQ(to_string(OffloadDevice::kCpu), "cpu");
  EXPECT_STREQ(to_string(ConfigFormat::kAccelerateYaml), "accelerate_yaml");
}

}  // namespace
}  // namespace tandem
