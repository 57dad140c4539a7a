// Where tandem read a file differently from DeepSpeed's DeepSpeedConfig or
// Accelerate's loader by mistake (found by tests/config/conformance.py): the
// file is now accepted or refused as they do. The deliberate differences are
// in docs/config.md, "Conformance with DeepSpeed and Accelerate".

#include <gtest/gtest.h>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::config_data_dir;
using testing::contains;
using testing::load_error;
using testing::parse_error;
using testing::warned_keys;

// DeepSpeed: DeepSpeedFP16Config.min_loss_scale is an int, 0.5 a ValidationError.
TEST(PeerConformance, FractionalMinLossScaleIsRefusedInDeepSpeedJsonOnly) {
  std::string message = load_error("ds_fp16_fractional_min_scale.json");
  EXPECT_TRUE(contains(message, "ds_fp16_fractional_min_scale.json:4:64: fp16.min_loss_scale: "
                                "expected a positive integer, got 0.5; DeepSpeed reads "
                                "fp16.min_loss_scale as a whole number"));
  Config whole = parse_config_text(R"({"fp16": {"enabled": true, "min_loss_scale": 2}})",
                                   "ds.json");
  EXPECT_EQ(whole.fp16.min_loss_scale, 2.0);
  // tandem YAML's loss scaler block keeps fractions (torch's GradScaler floor).
  Config yaml = parse_config_text("fp16:\n  min_loss_scale: 0.5\n", "t.yaml");
  EXPECT_EQ(yaml.fp16.min_loss_scale, 0.5);
}

// DeepSpeed: DeepSpeedZeroConfig.reduce_bucket_size has gt=0.
TEST(PeerConformance, ReduceBucketSizeZeroIsRefusedInDeepSpeedJsonButNotInTandemYaml) {
  std::string message = load_error("ds_reduce_bucket_zero.json");
  EXPECT_TRUE(contains(message, "ds_reduce_bucket_zero.json:4:59: "
                                "zero_optimization.reduce_bucket_size: expected a positive "
                                "integer, got 0; DeepSpeed requires reduce_bucket_size > 0; 1 "
                                "reduces each gradient on its own"));
  Config yaml = parse_config_text("zero_optimization:\n  reduce_bucket_size: 0\n", "t.yaml");
  EXPECT_EQ(yaml.zero.reduce_bucket_size, 0);
}

// DeepSpeed: _reject_removed_config_keys (deepspeedai/DeepSpeed#8489).
TEST(PeerConformance, BlocksDeepSpeedHasRemovedAreRefusedNotWarned) {
  std::string message = load_error("ds_removed_elasticity.json");
  EXPECT_TRUE(contains(message, "ds_removed_elasticity.json:4:17: elasticity: DeepSpeed has "
                                "removed this feature"));
  EXPECT_TRUE(contains(message, "set train_batch_size, train_micro_batch_size_per_gpu and "
                                "gradient_accumulation_steps directly"));
  EXPECT_TRUE(contains(load_error("ds_removed_amp.json"),
                       "amp: DeepSpeed has removed this feature, and current DeepSpeed refuses "
                       "a config that still has the key (deepspeedai/DeepSpeed#8489); use the "
                       "fp16 or bf16 block instead of Apex AMP"));
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})",
                                   "ds.json"),
                       "ds.json:1:55: zero_optimization.mics_shard_size: DeepSpeed has removed "
                       "this feature"));
  // Keys DeepSpeed still reads keep their one warning.
  Config c = parse_config_text(R"({"wandb": {"enabled": false}})", "ds.json");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "ds.json:1:2: 'wandb' is DeepSpeed's own logging or "
                                      "profiling: tandem logs through the Accelerator's trackers"));
}

// DeepSpeed: DeepSpeedConfigModel refuses a deprecated field next to its replacement.
TEST(PeerConformance, DeprecatedCpuOffloadNextToItsReplacementIsRefused) {
  std::string message = load_error("ds_cpu_offload_and_offload_optimizer.json");
  EXPECT_TRUE(contains(message, "ds_cpu_offload_and_offload_optimizer.json:6:20: "
                                "zero_optimization.cpu_offload: the deprecated spelling of "
                                "offload_optimizer, which is given too (DeepSpeed refuses both "
                                "together); remove cpu_offload and keep offload_optimizer"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"offload_param": {"device": "cpu"},
                     "cpu_offload_param": false}})",
                  "ds.json"),
      "zero_optimization.cpu_offload_param: the deprecated spelling of offload_param"));
  // Alone, each spelling still works.
  Config legacy = load_config_file(config_data("ds_legacy_cpu_offload.json"));
  EXPECT_EQ(legacy.zero.offload_optimizer, OffloadDevice::kCpu);
}

TEST(PeerConformance, QuotedNumberIsToldToLoseTheQuotesEvenWhereTheFixIsSpecific) {
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": {"stage": "2"}})", "ds.json"),
                       "zero_optimization.stage: expected an integer 0..3, got \"2\"; write it "
                       "without quotes"));
  // Out of range even without quotes: the range is the fix.
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": {"stage": "7"}})", "ds.json"),
                       "got \"7\"; set it to 0, 1, 2 or 3"));
  EXPECT_TRUE(contains(load_error("accelerate_quoted_port.yaml"),
                       "accelerate_quoted_port.yaml:7:20: main_process_port: expected an "
                       "integer 1..65535, got \"29500\"; write it without quotes"));
}

// Accelerate: DistributedType(value) after PyYAML, which reads a bare NO as
// False; `accelerate launch` then matches no type and runs the file as NO.
TEST(PeerConformance, AccelerateDistributedTypeIsNoOrTheExactCapitals) {
  const Config bare = load_config_file(testing::config_data("accelerate_no_unquoted.yaml"));
  EXPECT_EQ(bare.distributed_type, DistributedType::kNo);
  ASSERT_EQ(bare.warnings.size(), 1u);
  EXPECT_TRUE(contains(bare.warnings[0],
                       "accelerate_no_unquoted.yaml:3:19: distributed_type: an unquoted NO is "
                       "the boolean false in YAML 1.1 (PyYAML, Accelerate's loader), which "
                       "`accelerate launch` runs as NO; read as NO"))
      << bare.warnings[0];
  EXPECT_TRUE(contains(load_error("accelerate_lowercase_type.yaml"),
                       "accelerate_lowercase_type.yaml:2:19: distributed_type: Accelerate's "
                       "loader takes only the exact name, in capitals; write MULTI_GPU"));
  Config quoted = parse_config_text("distributed_type: 'NO'\nnum_processes: 1\n", "a.yaml");
  EXPECT_EQ(quoted.distributed_type, DistributedType::kNo);
  // tandem's own YAML keeps any case, quoted or not.
  Config own = parse_config_text("distributed: NO\n", "t.yaml");
  EXPECT_EQ(own.distributed_type, DistributedType::kNo);
  EXPECT_EQ(parse_config_text("distributed: multi_gpu\n", "t.yaml").distributed_type,
            DistributedType::kMultiGpu);
}

// Accelerate: launch calls args.mixed_precision.lower() on PyYAML's False.
TEST(PeerConformance, AccelerateMixedPrecisionUnquotedNoIsRefused) {
  EXPECT_TRUE(contains(load_error("accelerate_precision_unquoted_no.yaml"),
                       "accelerate_precision_unquoted_no.yaml:3:18: mixed_precision: an "
                       "unquoted no is a boolean in YAML 1.1"));
  Config c = parse_config_text("distributed_type: MULTI_GPU\nmixed_precision: 'no'\n", "a.yaml");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kNo);
  EXPECT_EQ(parse_config_text("mixed_precision: no\n", "t.yaml").mixed_precision,
            MixedPrecision::kNo);
}

// Accelerate: ClusterConfig.same_network defaults to False (what `accelerate
// config default` writes), and `accelerate config` writes true for machines
// on one network. tandem launch treats both alike (every node reaches
// main_process_ip:main_process_port), so neither says anything.
TEST(PeerConformance, AccelerateSameNetworkIsQuietAtEitherValue) {
  EXPECT_TRUE(parse_config_text("distributed_type: MULTI_GPU\n", "a.yaml").warnings.empty());
  // same_network: true and a dynamo_config, which warns.
  EXPECT_EQ(warned_keys(load_config_file(config_data("accelerate_deepspeed.yaml"))),
            std::vector<std::string>{"dynamo_config"});
  for (const char* value : {"false", "true"}) {
    const Config c = parse_config_text(
        std::string("distributed_type: MULTI_GPU\nsame_network: ") + value + "\n", "a.yaml");
    EXPECT_TRUE(c.warnings.empty()) << value << ": " << c.warnings.front();
    const Config t = parse_config_text(std::string("same_network: ") + value + "\n", "t.yaml");
    EXPECT_TRUE(t.warnings.empty()) << value << ": " << t.warnings.front();
  }
  // `accelerate config default`'s file, as it writes it (JSON).
  const Config written = parse_config_text(R"({
  "compute_environment": "LOCAL_MACHINE", "debug": false, "distributed_type": "NO",
  "downcast_bf16": false, "enable_cpu_affinity": false, "machine_rank": 0,
  "main_training_function": "main", "mixed_precision": "no", "num_machines": 1,
  "num_processes": 1, "rdzv_backend": "static", "same_network": false,
  "tpu_use_cluster": false, "tpu_use_sudo": false, "use_cpu": true})", "default_config.yaml");
  EXPECT_TRUE(written.warnings.empty()) << written.warnings.front();
  EXPECT_TRUE(contains(parse_error("distributed_type: MULTI_GPU\nsame_network: maybe\n", "a.yaml"),
                       "same_network: expected true or false"));
}

// Accelerate: DeepSpeedPlugin refuses a file without zero_optimization, and
// DeepSpeed trains with the file, so a block without a stage means stage 0.
TEST(PeerConformance, DeepSpeedConfigFileDecidesTheZeroStage) {
  std::string message = load_error("accelerate_ds_file_without_zero.yaml");
  EXPECT_TRUE(contains(message, "accelerate_ds_file_without_zero.yaml:4:26: "
                                "deepspeed_config.deepspeed_config_file: "));
  EXPECT_TRUE(contains(message, "ds_fp16_static_scale.json\" has no zero_optimization block, "
                                "which Accelerate requires of a deepspeed_config_file; add "
                                "\"zero_optimization\": {\"stage\": 0}"));
  EXPECT_EQ(load_config_file(config_data("accelerate_ds_file_zero_no_stage.yaml")).zero.stage, 0);
  // Without a file, Accelerate's plugin starts from stage 2.
  EXPECT_EQ(load_config_file(config_data("accelerate_ds_no_stage.yaml")).zero.stage, 2);
  Config with_stage = parse_config_text(
      "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: "
      "ds_zero_no_stage.json\n  zero_stage: 1\n",
      "a.yaml", config_data_dir());
  EXPECT_EQ(with_stage.zero.stage, 1);
}

}  // namespace
}  // namespace tandem
