// Files in the shapes that Accelerate's and DeepSpeed's published templates
// use (written for these tests, not copied): what a new user brings on day
// one must load, or be refused with a message that says what tandem does
// instead.

#include <unistd.h>


#include <gtest/gtest.h>

#include "tandem/core/file_system.h"
#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::config_data_dir;
using testing::contains;
using testing::load_error;
using testing::parse_error;
using testing::warned_keys;

TEST(RealWorldConfigs, TrainerStyleZero3WithEveryValueAutoLoads) {
  Config c = load_config_file(config_data("ds_trainer_zero3_auto.json"));
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kNo);  // fp16/bf16 "auto"
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.scheduler.auto_params.size(), 4u);
  // "auto" says nothing (stage3_gather_16bit_weights_on_model_save "auto"
  // reads as true); the sizes the Trainer's template sets for what tandem
  // does not do warn.
  EXPECT_EQ(c.zero.gather_16bit_weights_on_model_save, std::optional<bool>(true));
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(100));
  EXPECT_EQ(warned_keys(c),
            (std::vector<std::string>{"zero_optimization.stage3_max_reuse_distance",
                                      "zero_optimization.sub_group_size"}));

  Config r = resolve_config(c, {}, {}, 8);
  EXPECT_EQ(r.num_processes, 8);
  EXPECT_EQ(r.gradient_accumulation_steps, 1);
  EXPECT_FALSE(r.train_batch_size.has_value());
}

TEST(RealWorldConfigs, AccelerateSectionValuesFillTheJsonsAuto) {
  Config c = parse_config_text(R"(distributed_type: DEEPSPEED
num_processes: 2
deepspeed_config:
  deepspeed_config_file: ds_trainer_zero3_auto.json
  zero3_save_16bit_model: true
  gradient_clipping: 0.5
)",
                               "a.yaml", config_data_dir());
  EXPECT_EQ(c.gradient_clipping, 0.5);
  // Filled, so no longer "auto".
  EXPECT_EQ(c.auto_keys.count("gradient_clipping"), 0u);
  // A 16-bit save is asked for, which save_model under ZeRO-3 then writes.
  const std::vector<std::string> warned = warned_keys(c);
  EXPECT_EQ(std::count(warned.begin(), warned.end(), "deepspeed_config.zero3_save_16bit_model"),
            0);
  EXPECT_EQ(c.zero.gather_16bit_weights_on_model_save, std::optional<bool>(true));
}

TEST(RealWorldConfigs, GradientClippingAutoInTheAccelerateSectionIsListedAsAuto) {
  Config c = parse_config_text(
      "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
      "  gradient_clipping: auto\n  gradient_accumulation_steps: auto\n",
      "a.yaml");
  EXPECT_EQ(c.gradient_clipping, 1.0);  // Accelerate fills "auto" with 1.0
  EXPECT_EQ(c.auto_keys.count("gradient_clipping"), 1u);
  EXPECT_FALSE(c.gradient_accumulation_steps.has_value());
}

TEST(RealWorldConfigs, SmallestZeroBucketSizesDeepSpeedAcceptsAreAccepted) {
  Config c = load_config_file(config_data("ds_zero3_small_buckets.json"));
  EXPECT_EQ(c.zero.reduce_bucket_size, 1);           // a bucket per gradient
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 0);  // no prefetch
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 0);
  Config r = resolve_config(c, {}, {}, 4);
  EXPECT_EQ(r.train_batch_size, 2 * 2 * 4);
}

TEST(RealWorldConfigs, MultiNodeAccelerateConfigKeepsTheTotalProcessCount) {
  Config c = load_config_file(config_data("accelerate_multi_node.yaml"));
  EXPECT_EQ(c.distributed_type, DistributedType::kMultiGpu);
  EXPECT_EQ(c.num_processes, 16);
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.machine_rank, 1);
  EXPECT_EQ(c.main_process_ip, "10.20.0.7");
  EXPECT_EQ(c.main_process_port, 29600);
  EXPECT_EQ(c.rdzv_backend, "c10d");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);
  EXPECT_EQ(warned_keys(c), std::vector<std::string>{});
}

TEST(RealWorldConfigs, DistributedNoRunsOneProcessWhateverNumProcessesSays) {
  Config c = load_config_file(config_data("accelerate_no_with_processes.yaml"));
  EXPECT_EQ(c.num_processes, 1);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "accelerate_no_with_processes.yaml:6:16: 'num_processes: "
                                      "4' is ignored because distributed_type is NO"));
  EXPECT_TRUE(contains(c.warnings[0], "set distributed_type to MULTI_GPU"));
}

TEST(RealWorldConfigs, NumProcessesMinusOneLeavesTheCountToTheLaunch) {
  Config c = parse_config_text("distributed_type: MULTI_GPU\nnum_processes: -1\n", "a.yaml");
  EXPECT_FALSE(c.num_processes.has_value());
  EXPECT_EQ(c.key_locations.count("num_processes"), 0u);
}

// An FSDP2 file as `accelerate config` writes it trains as ZeRO-3; the key
// tandem does not follow (its state dict type) says so.
TEST(RealWorldConfigs, FsdpConfigTrainsAsZero3) {
  Config c = load_config_file(config_data("accelerate_fsdp.yaml"));
  EXPECT_EQ(c.distributed_type, DistributedType::kFsdp);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.hpz_partition_size, 1);
  EXPECT_EQ(c.zero.offload_param, OffloadDevice::kNone);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(warned_keys(c), std::vector<std::string>{"fsdp_config.fsdp_state_dict_type"});
  // Its TRANSFORMER_BASED_WRAP names no layer (transformers takes them from
  // the Python model): no unit by policy, and the Accelerator says so.
  EXPECT_EQ(c.zero.auto_wrap_policy, "TRANSFORMER_BASED_WRAP");
  EXPECT_TRUE(c.zero.auto_wrap_layer_types.empty());
}

TEST(RealWorldConfigs, ContextParallelismIsRefusedNotSilentlyDropped) {
  std::string message = load_error("accelerate_context_parallel.yaml");
  EXPECT_TRUE(contains(message, "accelerate_context_parallel.yaml:10:31: "
                                "parallelism_config.parallelism_config_cp_size: context "
                                "parallelism of size 2 is not supported by tandem"));
  EXPECT_TRUE(contains(message, "remove parallelism_config from the Accelerate config, or set "
                                "the size to 1"));
  // Sizes of 1 ask for nothing; the DeepSpeed sequence-parallel key warns.
  Config c = parse_config_text(R"(distributed_type: DEEPSPEED
deepspeed_config:
  seq_parallel_communication_data_type: bf16
parallelism_config:
  parallelism_config_tp_size: 1
  parallelism_config_cp_size: 1
tp_config:
  tp_size: 1
)",
                               "a.yaml");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "'deepspeed_config.seq_parallel_communication_data_type'"));
}

TEST(RealWorldConfigs, TensorParallelismIsRefusedInEachFormat) {
  EXPECT_TRUE(contains(parse_error("distributed_type: MULTI_GPU\ntp_config:\n  tp_size: 4\n",
                                   "a.yaml"),
                       "a.yaml:3:12: tp_config.tp_size: tensor parallelism of size 4 is not "
                       "supported by tandem"));
  EXPECT_TRUE(contains(parse_error("distributed_type: TP\n", "a.yaml"),
                       "Accelerate's TP is not supported by tandem, which trains data parallel "
                       "only"));
  std::string message = parse_error(
      R"({"zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 4}})", "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:1:72: tensor_parallel.autotp_size: tensor parallelism "
                                "of size 4 is not supported by tandem"));
  EXPECT_TRUE(contains(message, "remove the tensor_parallel block"));
  EXPECT_TRUE(contains(parse_error(R"({"sequence_parallel_size": 2})", "ds.json"),
                       "sequence_parallel_size: sequence (Ulysses) parallelism of size 2"));
  Config c = parse_config_text(R"({"tensor_parallel": {"autotp_size": 1}})", "ds.json");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(RealWorldConfigs, OtherAcceleratorsAreRefusedSayingWhatTandemRunsOn) {
  EXPECT_TRUE(contains(parse_error("distributed_type: MULTI_XPU\nnum_processes: 2\n", "a.yaml"),
                       "Accelerate's MULTI_XPU is not supported by tandem, which runs on CPUs "
                       "and CUDA GPUs; use NO, MULTI_CPU, MULTI_GPU, DEEPSPEED or FSDP"));
}

// Changes the working directory for one test, and back.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const std::string& path) : saved_(fs::current_directory()) {
    fs::change_directory(path);
  }
  ~WorkingDirectory() { fs::change_directory(saved_); }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;

 private:
  std::string saved_;
};

TEST(RealWorldConfigs, DeepSpeedFileIsFoundFromTheWorkingDirectoryAsAccelerateDoes) {
  testing::TempFolder project;
  ASSERT_FALSE(project.path().empty());
  project.write("configs/ds.json", R"({"zero_optimization": {"stage": 1}})");
  // Written for `accelerate launch` run from the project root.
  project.write("configs/accelerate.yaml",
                "distributed_type: DEEPSPEED\nnum_processes: 2\n"
                "deepspeed_config:\n  deepspeed_config_file: configs/ds.json\n");
  WorkingDirectory cwd(project.path());
  Config c = load_config_file("configs/accelerate.yaml");
  EXPECT_EQ(c.zero.stage, 1);

  // Next to the YAML still wins.
  project.write("configs/configs/ds.json", R"({"zero_optimization": {"stage": 3}})");
  EXPECT_EQ(load_config_file("configs/accelerate.yaml").zero.stage, 3);
}

}  // namespace
}  // namespace tandem
