#include <gtest/gtest.h>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::config_data_dir;
using testing::contains;
using testing::parse_error;
using testing::warned_keys;

TEST(AccelerateYaml, ReadsMultiCpuLaunchKeysAndIgnoresKeysMeaninglessHere) {
  Config c = load_config_file(config_data("accelerate_multi_cpu.yaml"));
  EXPECT_EQ(c.format, ConfigFormat::kAccelerateYaml);
  EXPECT_EQ(c.source_path, config_data("accelerate_multi_cpu.yaml"));
  EXPECT_EQ(c.distributed_type, DistributedType::kMultiCpu);
  EXPECT_EQ(c.num_processes, 8);  // total across machines
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.machine_rank, 1);
  EXPECT_EQ(c.main_process_ip, "192.168.10.4");
  EXPECT_EQ(c.main_process_port, 29511);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
  EXPECT_TRUE(c.use_cpu);
  EXPECT_EQ(c.rdzv_backend, "static");
  EXPECT_EQ(c.gpu_ids, "all");
  EXPECT_EQ(c.zero.stage, 0);
  // debug, downcast_bf16, tpu_*, ipex_config, mpirun_config, same_network:
  // false, ... at the values Accelerate writes by default say nothing.
  EXPECT_EQ(warned_keys(c), std::vector<std::string>{});
}

// main_process_ip must be an address: one with its port pasted on, or an
// impossible one, would only show as a rendezvous that never meets.
TEST(AccelerateYaml, AMainProcessIpThatIsNoAddressIsRefusedWhereItIsWritten) {
  const std::string head = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n";
  const std::string with_port = parse_error(head + "main_process_ip: 10.0.0.1:29500\n", "a.yaml");
  EXPECT_TRUE(contains(with_port, "a.yaml:3:18: main_process_ip: '10.0.0.1:29500' is an address "
                                  "with a port; give the address alone ('10.0.0.1')"))
      << with_port;
  EXPECT_TRUE(contains(parse_error(head + "main_process_ip: 10.0.0.256\n", "a.yaml"),
                       "not an IPv4 address"));
  EXPECT_TRUE(contains(parse_error(head + "main_process_ip: -node1\n", "a.yaml"),
                       "cannot begin or end with '-'"));
  for (const std::string ok : {"10.0.0.1", "node001", "n1.cluster.example", "fd00::1", "::1"}) {
    EXPECT_EQ(parse_config_text(head + "main_process_ip: " + (ok.find(':') != std::string::npos
                                                                  ? "'" + ok + "'"
                                                                  : ok) +
                                    "\n",
                                "a.yaml")
                  .main_process_ip,
              ok);
  }
}

TEST(HostAddressProblem, NamesWhatIsWrong) {
  EXPECT_EQ(host_address_problem("10.0.0.1"), "");
  EXPECT_EQ(host_address_problem("node1."), "");
  EXPECT_NE(host_address_problem(""), "");
  EXPECT_TRUE(contains(host_address_problem("10.1"), "four numbers"));
  EXPECT_TRUE(contains(host_address_problem("a_b.c-d:x"), "not an IPv6 address"));
  EXPECT_TRUE(contains(host_address_problem(std::string(64, 'a')), "at most 63"));
  EXPECT_TRUE(contains(host_address_problem("node 1"), "' ' cannot be part of one"));
}

TEST(AccelerateYaml, ReadsTheDeepSpeedSection) {
  Config c = load_config_file(config_data("accelerate_deepspeed.yaml"));
  EXPECT_EQ(c.distributed_type, DistributedType::kDeepSpeed);
  EXPECT_EQ(c.num_processes, 4);
  EXPECT_EQ(c.gpu_ids, "0,1,2,3");
  EXPECT_EQ(c.rdzv_backend, "c10d");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.zero3_init);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_FALSE(c.fp16.deepspeed_semantics);  // no DeepSpeed fp16 block was read
  // A 16-bit save is asked for, and TorchDynamo, which tandem does not do.
  EXPECT_EQ(c.zero.gather_16bit_weights_on_model_save, std::optional<bool>(true));
  EXPECT_EQ(warned_keys(c), (std::vector<std::string>{"dynamo_config"}));
}

TEST(AccelerateYaml, MergesTheDeepSpeedConfigFileFromTheYamlFolder) {
  Config c = load_config_file(config_data("accelerate_ds_file.yaml"));
  EXPECT_EQ(c.format, ConfigFormat::kAccelerateYaml);
  EXPECT_EQ(c.distributed_type, DistributedType::kDeepSpeed);
  EXPECT_EQ(c.num_processes, 2);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_FALSE(c.zero.offload_pin_memory);
  EXPECT_FALSE(c.zero.zero3_init);
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);  // from the JSON file
  EXPECT_TRUE(c.fp16.deepspeed_semantics);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  // Locations and warnings point into the JSON file.
  EXPECT_TRUE(contains(c.key_locations.at("train_batch_size"), "ds_zero2_offload.json:2:23"));
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "ds_zero2_offload.json:46:5: "
                                      "'zero_optimization.round_robin_gradients'"));
  // The step report keys come along (Accelerate itself silences
  // DeepSpeed's progress line; tandem keeps what the file says).
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(50));
}

// Issue 33's bug: the activation_checkpointing block of a deepspeed_config_file
// was dropped when an Accelerate YAML pointed to the file.
TEST(AccelerateYaml, TheDeepSpeedFileKeepsEveryBlockItHad) {
  testing::TempFolder dir;
  const std::string json = dir.write("ds.json", R"({
  "train_micro_batch_size_per_gpu": 2,
  "gradient_clipping": 0.25,
  "zero_optimization": {"stage": 2},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
  "fp16": {"enabled": true, "initial_scale_power": 8},
  "activation_checkpointing": {}
})");
  const Config direct = load_config_file(json);
  const std::string yaml = dir.write(
      "a.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n");
  const Config through = load_config_file(yaml);
  EXPECT_TRUE(direct.activation_checkpointing.enabled);
  EXPECT_TRUE(through.activation_checkpointing.enabled) << "dropped through the YAML";
  EXPECT_EQ(through.train_micro_batch_size_per_gpu, direct.train_micro_batch_size_per_gpu);
  EXPECT_EQ(through.gradient_clipping, direct.gradient_clipping);
  EXPECT_EQ(through.zero.stage, direct.zero.stage);
  EXPECT_EQ(through.optimizer.type, direct.optimizer.type);
  EXPECT_EQ(through.optimizer.lr, direct.optimizer.lr);
  EXPECT_EQ(through.scheduler.type, direct.scheduler.type);
  EXPECT_EQ(through.fp16.initial_scale_power, direct.fp16.initial_scale_power);
  EXPECT_EQ(through.mixed_precision, direct.mixed_precision);
}

TEST(AccelerateYaml, SectionKeysThatDisagreeWithTheDeepSpeedFileAreRefused) {
  std::string message = parse_error(R"(distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: ds_zero2_offload.json
  zero_stage: 3
)",
                                    "a.yaml", config_data_dir());
  EXPECT_TRUE(contains(message, "a.yaml:4:15: deepspeed_config.zero_stage: 3 disagrees with "
                                "zero_optimization.stage = 2 at "));
  EXPECT_TRUE(contains(message, "ds_zero2_offload.json:35:14; give it in one place"));

  message = parse_error(R"(distributed_type: DEEPSPEED
mixed_precision: bf16
deepspeed_config:
  deepspeed_config_file: ds_zero2_offload.json
)",
                        "a.yaml", config_data_dir());
  EXPECT_TRUE(contains(message, "a.yaml:2:18: mixed_precision: bf16 disagrees with the "
                                "deepspeed_config_file, which enables fp16"));
}

TEST(AccelerateYaml, SectionKeysThatAgreeOrFillAutoValuesAreAccepted) {
  Config c = parse_config_text(R"(distributed_type: DEEPSPEED
mixed_precision: fp16
deepspeed_config:
  deepspeed_config_file: ds_hf_auto.json
  gradient_accumulation_steps: 8
  gradient_clipping: 1.0
)",
                               "a.yaml", config_data_dir());
  EXPECT_EQ(c.gradient_accumulation_steps, 8);  // the file said "auto"
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.key_locations.at("gradient_accumulation_steps"), "a.yaml:5:32");
}

TEST(AccelerateYaml, DeepSpeedWithoutAStageStartsAtStage2LikeAccelerate) {
  Config c = parse_config_text("distributed_type: DEEPSPEED\nnum_processes: 2\n", "a.yaml");
  EXPECT_EQ(c.zero.stage, 2);
}

TEST(AccelerateYaml, NoDistributionMeansOneProcess) {
  Config c = parse_config_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\n"
                               "mixed_precision: 'no'\nuse_cpu: false\n",
                               "a.yaml");
  EXPECT_EQ(c.distributed_type, DistributedType::kNo);
  EXPECT_EQ(c.num_processes, 1);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kNo);
}

TEST(AccelerateYaml, DeepSpeedSectionUnderAnotherTypeIsIgnoredWithAWarning) {
  Config c = parse_config_text(
      "distributed_type: MULTI_GPU\ndeepspeed_config:\n  zero_stage: 3\n", "a.yaml");
  EXPECT_EQ(c.zero.stage, 0);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "a.yaml:3:3: 'deepspeed_config' is ignored because "
                                      "distributed_type is MULTI_GPU"));
}

TEST(AccelerateYaml, AccelerateConfigSavedAsJsonIsRecognised) {
  Config c = parse_config_text(
      R"({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
          "num_processes": 2, "mixed_precision": "bf16"})",
      "default_config.json");
  EXPECT_EQ(c.format, ConfigFormat::kAccelerateYaml);
  EXPECT_EQ(c.distributed_type, DistributedType::kMultiGpu);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
}

TEST(AccelerateYaml, LegacyFp16FlagMeansFp16MixedPrecision) {
  Config c = parse_config_text("distributed_type: MULTI_GPU\nfp16: true\n", "a.yaml");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);
}

}  // namespace
}  // namespace tandem
