#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::contains;
using testing::usage_error;

Config triple(std::optional<int64_t> train, std::optional<int64_t> micro,
              std::optional<int64_t> accumulation) {
  Config c;
  c.train_batch_size = train;
  c.train_micro_batch_size_per_gpu = micro;
  c.gradient_accumulation_steps = accumulation;
  return c;
}

Config resolve(const Config& c, int world_size) { return resolve_config(c, {}, {}, world_size); }

TEST(ResolveConfig, InfersTrainBatchFromMicroAccumulationAndWorld) {
  Config r = resolve(triple(std::nullopt, 4, 2), 8);
  EXPECT_EQ(r.train_batch_size, 64);
}

TEST(ResolveConfig, InfersAccumulationFromTrainAndMicro) {
  Config r = resolve(triple(64, 4, std::nullopt), 4);
  EXPECT_EQ(r.gradient_accumulation_steps, 4);
}

TEST(ResolveConfig, InfersMicroFromTrainAndAccumulation) {
  Config r = resolve(triple(96, std::nullopt, 3), 4);
  EXPECT_EQ(r.train_micro_batch_size_per_gpu, 8);
}

TEST(ResolveConfig, TrainAloneSplitsOverTheWorldWithAccumulationOne) {
  Config r = resolve(triple(32, std::nullopt, std::nullopt), 4);
  EXPECT_EQ(r.gradient_accumulation_steps, 1);
  EXPECT_EQ(r.train_micro_batch_size_per_gpu, 8);
}

TEST(ResolveConfig, MicroAloneGetsAccumulationOne) {
  Config r = resolve(triple(std::nullopt, 6, std::nullopt), 3);
  EXPECT_EQ(r.gradient_accumulation_steps, 1);
  EXPECT_EQ(r.train_batch_size, 18);
}

TEST(ResolveConfig, NothingKnownLeavesTheBatchEmptyAndPrintsNull) {
  Config r = resolve(Config{}, 2);
  EXPECT_EQ(r.gradient_accumulation_steps, 1);
  EXPECT_FALSE(r.train_batch_size.has_value());
  EXPECT_FALSE(r.train_micro_batch_size_per_gpu.has_value());
  nlohmann::json j = nlohmann::json::parse(resolved_config_json(r, 2));
  EXPECT_TRUE(j["train_batch_size"].is_null());
  EXPECT_TRUE(j["train_micro_batch_size_per_gpu"].is_null());
  EXPECT_EQ(j["gradient_accumulation_steps"], 1);
}

TEST(ResolveConfig, ConsistentTripleIsKept) {
  Config r = resolve(triple(16, 2, 4), 2);
  EXPECT_EQ(r.train_batch_size, 16);
}

TEST(ResolveConfig, InconsistentTriplePrintsAllFourNumbersAndTheFile) {
  Config c = parse_config_text(R"({
  "train_batch_size": 32,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2
})",
                               "ds.json");
  std::string message = usage_error([&] { resolve(c, 2); });
  EXPECT_TRUE(contains(message, "ds.json:2:23: train_batch_size: 32 != "
                                "train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 "
                                "* world_size 2 = 16"));
  EXPECT_TRUE(contains(message, "train_micro_batch_size_per_gpu 4 from ds.json:3:37"));
  EXPECT_TRUE(contains(message, "gradient_accumulation_steps 2 from ds.json:4:34"));
  EXPECT_TRUE(contains(message, "set train_batch_size to \"auto\""));
  // The same file is consistent at world size 4.
  EXPECT_EQ(resolve(c, 4).train_batch_size, 32);
}

TEST(ResolveConfig, TrainNotDivisibleByMicroTimesWorldIsAnError) {
  std::string message = usage_error([] { resolve(triple(30, 4, std::nullopt), 2); });
  EXPECT_TRUE(contains(message, "30 is not a multiple of train_micro_batch_size_per_gpu 4 * "
                                "world_size 2 = 8, so gradient_accumulation_steps cannot be "
                                "derived"));
  EXPECT_TRUE(contains(message, "world_size 2)"));
  EXPECT_TRUE(contains(usage_error([] { resolve(triple(10, std::nullopt, std::nullopt), 4); }),
                       "10 is not a multiple of world_size 4"));
}

TEST(ResolveConfig, OverridesBeatEnvironmentWhichBeatsTheFile) {
  Config file = parse_config_text("mixed_precision: fp16\ngradient_accumulation_steps: 2\n"
                                  "seed: 1\ngradient_clipping: 1.0\n",
                                  "t.yaml");
  ConfigEnv env = ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", "bf16"},
                                       {"TANDEM_GRADIENT_ACCUMULATION_STEPS", "3"},
                                       {"TANDEM_SEED", "2"}});
  Config from_env = resolve_config(file, env, {}, 1);
  EXPECT_EQ(from_env.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(from_env.gradient_accumulation_steps, 3);
  EXPECT_EQ(from_env.seed, 2u);
  EXPECT_EQ(from_env.gradient_clipping, 1.0);

  ConfigOverrides code;
  code.mixed_precision = MixedPrecision::kNo;
  code.gradient_accumulation_steps = 4;
  code.seed = 3;
  code.gradient_clipping = 0.25;
  code.zero_stage = 2;
  code.train_micro_batch_size_per_gpu = 5;
  Config from_code = resolve_config(file, env, code, 2);
  EXPECT_EQ(from_code.mixed_precision, MixedPrecision::kNo);
  EXPECT_EQ(from_code.gradient_accumulation_steps, 4);
  EXPECT_EQ(from_code.seed, 3u);
  EXPECT_EQ(from_code.gradient_clipping, 0.25);
  EXPECT_EQ(from_code.zero.stage, 2);
  EXPECT_EQ(from_code.train_batch_size, 40);

  Config from_file = resolve_config(file, {}, {}, 1);
  EXPECT_EQ(from_file.mixed_precision, MixedPrecision::kFp16);
  EXPECT_EQ(from_file.gradient_accumulation_steps, 2);
}

TEST(ResolveConfig, OverrideThatContradictsTheFileNamesWhereEachNumberCameFrom) {
  Config file = parse_config_text("train_batch_size: 16\ngradient_accumulation_steps: 2\n",
                                  "t.yaml");
  ConfigOverrides code;
  code.train_micro_batch_size_per_gpu = 4;
  ConfigEnv env = ConfigEnv::from_map({{"TANDEM_GRADIENT_ACCUMULATION_STEPS", "3"}});
  std::string message = usage_error([&] { resolve_config(file, env, code, 2); });
  EXPECT_TRUE(contains(message, "t.yaml:1:19: train_batch_size: 16 != "
                                "train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 3 "
                                "* world_size 2 = 24"));
  EXPECT_TRUE(contains(message, "train_micro_batch_size_per_gpu 4 from code override"));
  EXPECT_TRUE(contains(message, "gradient_accumulation_steps 3 from "
                                "TANDEM_GRADIENT_ACCUMULATION_STEPS"));
}

TEST(ResolveConfig, TheLaunchWorldSizeWinsOverNumProcesses) {
  Config file = load_config_file(config_data("accelerate_multi_cpu.yaml"));
  ASSERT_EQ(file.num_processes, 8);
  Config r = resolve(file, 2);
  EXPECT_EQ(r.num_processes, 2);
}

TEST(ResolveConfig, BadOverridesAndWorldSizeAreRefused) {
  ConfigOverrides code;
  code.zero_stage = 4;
  EXPECT_TRUE(contains(usage_error([&] { resolve_config(Config{}, {}, code, 1); }),
                       "zero_stage override is 4; pass 0, 1, 2 or 3"));
  code = {};
  code.gradient_accumulation_steps = 0;
  EXPECT_TRUE(contains(usage_error([&] { resolve_config(Config{}, {}, code, 1); }),
                       "gradient_accumulation_steps override is 0"));
  EXPECT_TRUE(contains(usage_error([] { resolve(Config{}, 0); }), "world_size 0"));
}

TEST(ResolveConfig, ParamOffloadBelowStage3AddsOneWarning) {
  Config file = parse_config_text(
      R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})", "ds.json");
  Config r = resolve(resolve(file, 1), 1);  // resolving twice adds nothing more
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_TRUE(contains(r.warnings[0], "'zero_optimization.offload_param' applies to ZeRO stage 3 "
                                      "only; it has no effect at stage 2"));
}

// The offload a stage cannot do, and the ddp block under ZeRO, are said,
// naming where the value came from (the environment beats the file).
TEST(ResolveConfig, OffloadAStageCannotDoAndTheDdpBlockUnderZeroWarn) {
  Config st0 = parse_config_text(
      R"({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})", "ds.json");
  Config r = resolve(st0, 2);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_TRUE(contains(r.warnings[0], "ds.json:1:57: 'zero_optimization.offload_optimizer' "
                                      "applies to ZeRO stages 1-3"))
      << r.warnings[0];

  ConfigEnv env;
  env.offload_param = OffloadDevice::kCpu;
  Config from_env = resolve_config(
      parse_config_text(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}})",
                        "ds.json"),
      env, {}, 2);
  ASSERT_EQ(from_env.warnings.size(), 1u);
  EXPECT_TRUE(contains(from_env.warnings[0], "TANDEM_OFFLOAD_PARAM_DEVICE: "
                                             "'zero_optimization.offload_param' applies"))
      << from_env.warnings[0];

  Config ddp = parse_config_text(
      "zero_optimization:\n  stage: 2\nddp:\n  comm_hook: powersgd\n  bucket_cap_mb: 5\n",
      "t.yaml");
  Config warned = resolve(ddp, 2);
  ASSERT_EQ(warned.warnings.size(), 1u);
  EXPECT_TRUE(contains(warned.warnings[0], "the ddp block (comm_hook powersgd, bucket_cap_mb) "
                                           "configures DDP (ZeRO stage 0); at stage 2"))
      << warned.warnings[0];
  ddp.zero.stage = 0;
  EXPECT_TRUE(resolve(ddp, 2).warnings.empty());
}

// Settings that mean something at ZeRO stage 3 only are said to change
// nothing below it: zero3_init is turned off (as Accelerate turns
// zero3_init_flag off), and the stage-3 limits DeepSpeed takes silently warn.
TEST(ResolveConfig, StageThreeOnlySettingsBelowStageThreeWarn) {
  Config c = resolve(parse_config_text(R"({"zero_optimization": {"stage": 2,
      "stage3_max_live_parameters": 1000, "stage3_prefetch_bucket_size": "auto"}})",
                                       "ds.json"),
                     2);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("'zero_optimization.stage3_max_live_parameters' applies to ZeRO "
                               "stage 3 only"),
            std::string::npos)
      << c.warnings[0];
  Config init = parse_config_text("zero_optimization:\n  stage: 2\n  zero3_init: true\n", "t.yaml");
  EXPECT_TRUE(init.zero.zero3_init);
  init = resolve(init, 2);
  EXPECT_FALSE(init.zero.zero3_init);
  ASSERT_EQ(init.warnings.size(), 1u);
  EXPECT_NE(init.warnings[0].find("zero3_init (zero3_init_flag) applies to ZeRO stage 3 only; "
                                  "turned off at stage 2"),
            std::string::npos)
      << init.warnings[0];
  EXPECT_TRUE(resolve(parse_config_text("zero_optimization:\n  stage: 3\n  zero3_init: true\n",
                                        "t.yaml"),
                      2)
                  .zero.zero3_init);
}

// use_cpu trains on the CPU, where the Accelerator refuses fp16: the
// contradiction is an error when the file is resolved (tandem config check,
// tandem launch), naming where fp16 came from and the fix.
TEST(ResolveConfig, Fp16WithUseCpuIsRefusedNamingWhereEachCameFrom) {
  const Config file = parse_config_text("use_cpu: true\nmixed_precision: fp16\n", "t.yaml");
  const std::string message = usage_error([&] { resolve(file, 1); });
  EXPECT_TRUE(contains(message, "t.yaml:2:18: mixed_precision fp16 with use_cpu: true "
                                "(t.yaml:1:10): fp16 needs a CUDA device"))
      << message;
  EXPECT_TRUE(contains(message, "use mixed_precision bf16 (or no) on the CPU, or set use_cpu: "
                                "false")) << message;
  // An Accelerate file says the same.
  EXPECT_TRUE(contains(
      usage_error([] {
        resolve(parse_config_text("distributed_type: MULTI_CPU\nuse_cpu: true\n"
                                  "mixed_precision: fp16\n", "a.yaml"), 2);
      }),
      "a.yaml:3:18: mixed_precision fp16 with use_cpu: true"));
  // The variable or the code may set fp16 too, or fix the file.
  const Config cpu = parse_config_text("use_cpu: true\n", "t.yaml");
  const ConfigEnv fp16_env = ConfigEnv::from_map({{"TANDEM_MIXED_PRECISION", "fp16"}});
  EXPECT_TRUE(contains(usage_error([&] { resolve_config(cpu, fp16_env, {}, 1); }),
                       "TANDEM_MIXED_PRECISION: mixed_precision fp16 with use_cpu: true"));
  ConfigOverrides bf16;
  bf16.mixed_precision = MixedPrecision::kBf16;
  EXPECT_EQ(resolve_config(file, {}, bf16, 1).mixed_precision, MixedPrecision::kBf16);
  // fp16 on a GPU config, and bf16 on the CPU, are fine.
  EXPECT_EQ(resolve(parse_config_text("mixed_precision: fp16\n", "t.yaml"), 1).mixed_precision,
            MixedPrecision::kFp16);
  EXPECT_EQ(resolve(parse_config_text("use_cpu: true\nmixed_precision: bf16\n", "t.yaml"), 1)
                .mixed_precision,
            MixedPrecision::kBf16);
}

TEST(ResolveConfig, ResolvedJsonHasTheDocumentedKeys) {
  Config file = load_config_file(config_data("ds_zero2_offload.json"));
  Config r = resolve(file, 4);
  nlohmann::json j = nlohmann::json::parse(resolved_config_json(r, 4));
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["num_machines"], 1);
  EXPECT_EQ(j["machine_rank"], 0);
  EXPECT_EQ(j["mixed_precision"], "fp16");
  EXPECT_EQ(j["distributed_type"], "DEEPSPEED");
  EXPECT_EQ(j["train_batch_size"], 64);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(j["gradient_accumulation_steps"], 2);
  EXPECT_EQ(j["gradient_clipping"], 0.5);
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["device"], "none");
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 250000000);
  EXPECT_EQ(j["optimizer"]["type"], "AdamW");
  EXPECT_EQ(j["optimizer"]["params"]["betas"][1], 0.95);
  EXPECT_EQ(j["scheduler"]["type"], "WarmupDecayLR");
  EXPECT_EQ(j["scheduler"]["params"]["warmup_type"], "linear");
  EXPECT_EQ(j["fp16"]["enabled"], true);
  EXPECT_EQ(j["fp16"]["initial_scale_power"], 12);
  EXPECT_EQ(j["source"]["format"], "deepspeed_json");
  EXPECT_EQ(j["source"]["path"], config_data("ds_zero2_offload.json"));
  ASSERT_EQ(j["warnings"].size(), 1u);  // the file's key tandem does not implement
  EXPECT_EQ(j["wall_clock_breakdown"], true);
  EXPECT_EQ(j["steps_per_print"], 50);
  // Keys tandem does not implement are not reported as if they were settings.
  EXPECT_EQ(j["zero_optimization"]["overlap_comm"], false);  // a setting now
  EXPECT_FALSE(j["zero_optimization"].contains("round_robin_gradients"));
  EXPECT_FALSE(j["launch"].contains("same_network"));
}

TEST(ResolveConfig, ResolvedJsonPrintsAutoParametersAsNull) {
  Config r = resolve(load_config_file(config_data("ds_hf_auto.json")), 1);
  nlohmann::json j = nlohmann::json::parse(resolved_config_json(r, 1));
  EXPECT_TRUE(j["optimizer"]["params"]["lr"].is_null());
  EXPECT_TRUE(j["scheduler"]["params"]["total_num_steps"].is_null());
  EXPECT_TRUE(j["seed"].is_null());
  EXPECT_EQ(j["mixed_precision"], "no");
}

}  // namespace
}  // namespace tandem
