#include <gtest/gtest.h>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::contains;
using testing::parse_error;
using testing::warned_keys;

TEST(DeepSpeedJson, ReadsZeroStage2WithCpuOffloadWarmupDecayAndFp16) {
  Config c = load_config_file(config_data("ds_zero2_offload.json"));
  EXPECT_EQ(c.format, ConfigFormat::kDeepSpeedJson);
  EXPECT_EQ(c.distributed_type, DistributedType::kDeepSpeed);
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_FALSE(c.train_micro_batch_size_per_gpu.has_value());
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.gradient_clipping, 0.5);

  EXPECT_EQ(c.optimizer.type, "AdamW");  // "adamw" canonicalised
  EXPECT_EQ(c.optimizer.lr, 2e-4);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);

  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c.scheduler.params.at("warmup_min_lr"), 0.0);
  EXPECT_EQ(c.scheduler.params.at("warmup_max_lr"), 2e-4);
  EXPECT_EQ(c.scheduler.params.at("warmup_num_steps"), 500.0);
  EXPECT_EQ(c.scheduler.params.at("total_num_steps"), 20000.0);
  EXPECT_EQ(c.scheduler.warmup_type, "linear");
  EXPECT_TRUE(c.scheduler.auto_params.empty());

  EXPECT_EQ(c.mixed_precision, MixedPrecision::kFp16);
  EXPECT_TRUE(c.fp16.deepspeed_semantics);
  EXPECT_EQ(c.fp16.loss_scale, 0.0);
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 500);
  EXPECT_EQ(c.fp16.hysteresis, 3);
  EXPECT_TRUE(c.fp16.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.min_loss_scale, 2.0);

  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param, OffloadDevice::kNone);
  EXPECT_FALSE(c.zero.offload_pin_memory);
  EXPECT_EQ(c.zero.reduce_bucket_size, 250'000'000);  // written 2.5e8

  EXPECT_EQ(c.zero.allgather_bucket_size, 200'000'000);  // written 2e8
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.reduce_scatter);

  // The step report: a progress line every 50 steps, with the breakdown.
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(50));

  // One line per key asking for what tandem does not do, naming it and what
  // tandem does instead; allgather_partitions: true asks for what it does.
  EXPECT_EQ(warned_keys(c), (std::vector<std::string>{"zero_optimization.round_robin_gradients"}));
  EXPECT_TRUE(contains(c.warnings[0], "ds_zero2_offload.json:46:5: "
                                      "'zero_optimization.round_robin_gradients' is not "
                                      "implemented by tandem's ZeRO; ignored"));
}

TEST(DeepSpeedJson, ReadsZeroStage3WithParamOffloadOneCycleBf16AndComments) {
  Config c = load_config_file(config_data("ds_zero3_onecycle.json"));
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
  EXPECT_FALSE(c.fp16.deepspeed_semantics);  // no fp16 block

  // DeepSpeed runs "Adam" as AdamW unless adam_w_mode is false.
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_FALSE(c.optimizer.beta1.has_value());

  EXPECT_EQ(c.scheduler.type, "OneCycle");
  EXPECT_EQ(c.scheduler.params.size(), 12u);
  EXPECT_EQ(c.scheduler.params.at("cycle_momentum"), 1.0);
  EXPECT_EQ(c.scheduler.params.at("cycle_min_mom"), 0.85);
  EXPECT_EQ(c.scheduler.params.at("decay_step_size"), 100.0);

  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 45'000'000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 300'000'000);
  EXPECT_TRUE(c.activation_checkpointing.enabled);

  // One line per recognised key asking for what tandem does not do; the
  // default sub_group_size (1e9), overlap_comm: true and offload_param's
  // buffer_count 5 ask for nothing.
  EXPECT_EQ(warned_keys(c),
            (std::vector<std::string>{
                "activation_checkpointing.partition_activations",
                "zero_optimization.stage3_max_reuse_distance"}));
  // The tensorboard block is read (off here), with DeepSpeed's job name.
  EXPECT_FALSE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.dir(), "runs/DeepSpeedJobName");
  EXPECT_EQ(c.zero.gather_16bit_weights_on_model_save, std::optional<bool>(true));
}

TEST(DeepSpeedJson, AutoValuesAsHfTrainerWritesThemLeaveFieldsEmpty) {
  Config c = load_config_file(config_data("ds_hf_auto.json"));
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_FALSE(c.train_micro_batch_size_per_gpu.has_value());
  EXPECT_FALSE(c.gradient_accumulation_steps.has_value());
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kNo);  // fp16/bf16 "auto": code decides
  EXPECT_EQ(c.gradient_clipping, 1.0);  // "auto": what Accelerate and HF's Trainer fill in

  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_FALSE(c.optimizer.lr || c.optimizer.beta1 || c.optimizer.beta2 || c.optimizer.eps ||
               c.optimizer.weight_decay);

  EXPECT_EQ(c.scheduler.type, "WarmupDecayLR");
  EXPECT_TRUE(c.scheduler.params.empty());
  EXPECT_EQ(c.scheduler.auto_params, (std::set<std::string>{"total_num_steps", "warmup_max_lr",
                                                           "warmup_min_lr", "warmup_num_steps"}));

  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.reduce_bucket_size, ZeroConfig{}.reduce_bucket_size);
  EXPECT_EQ(c.auto_keys,
            (std::set<std::string>{"bf16.enabled", "fp16.enabled", "gradient_clipping",
                                   "zero_optimization.reduce_bucket_size",
                                   "zero_optimization.stage3_param_persistence_threshold",
                                   "zero_optimization.stage3_prefetch_bucket_size"}));
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(500));
  EXPECT_FALSE(c.wall_clock_breakdown);
  // What the file asks beyond that and tandem does not do warns, "auto" never.
  EXPECT_EQ(warned_keys(c),
            (std::vector<std::string>{"zero_optimization.stage3_max_reuse_distance",
                                      "zero_optimization.sub_group_size"}));
}

TEST(DeepSpeedJson, GradientClippingNotGivenIsDeepSpeedsOne) {
  // DeepSpeed 0.19.8 clips at 1.0 when the key is absent; so does an
  // Accelerate DEEPSPEED config without a file. A tandem YAML does not clip.
  EXPECT_EQ(parse_config_text("{\"train_micro_batch_size_per_gpu\": 2}", "ds.json")
                .gradient_clipping,
            1.0);
  EXPECT_EQ(parse_config_text("{\"gradient_clipping\": 0}", "ds.json").gradient_clipping, 0.0);
  EXPECT_EQ(parse_config_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n",
                              "a.yaml")
                .gradient_clipping,
            1.0);
  EXPECT_EQ(parse_config_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
                              "  gradient_clipping: 0.0\n",
                              "a.yaml")
                .gradient_clipping,
            0.0);
  EXPECT_EQ(parse_config_text("seed: 1\n", "t.yaml").gradient_clipping, 0.0);
}

TEST(DeepSpeedJson, AdamStaysAdamWhenAdamWModeIsFalse) {
  Config c = parse_config_text(
      R"({"optimizer": {"type": "Adam", "params": {"lr": 0.1, "adam_w_mode": false}}})",
      "ds.json");
  EXPECT_EQ(c.optimizer.type, "Adam");
}

TEST(DeepSpeedJson, SgdTakesMomentumAndRefusesBetas) {
  Config c = parse_config_text(
      R"({"optimizer": {"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9}}})", "ds.json");
  EXPECT_EQ(c.optimizer.type, "SGD");
  EXPECT_EQ(c.optimizer.momentum, 0.9);

  std::string message = parse_error(
      R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})", "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:1:42: optimizer.params.betas: unknown key for SGD"));
}

// torch.optim.SGD's nesterov and dampening, which DeepSpeed passes through:
// read, and refused where torch refuses them (Nesterov without momentum or
// with dampening), in either key order.
TEST(DeepSpeedJson, SgdTakesNesterovAndDampeningAsTorchDoes) {
  Config c = parse_config_text(
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9,
          "nesterov": true, "dampening": 0}}})", "ds.json");
  EXPECT_EQ(c.optimizer.nesterov, true);
  EXPECT_EQ(c.optimizer.dampening, 0.0);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings[0];
  for (const char* text :
       {R"({"optimizer": {"type": "SGD", "params": {"nesterov": true, "lr": 0.1}}})",
        R"({"optimizer": {"type": "SGD", "params": {"nesterov": true, "momentum": 0.9,
            "dampening": 0.5}}})"}) {
    const std::string message = parse_error(text, "ds.json");
    EXPECT_TRUE(contains(message, "ds.json:1:")) << message;
    EXPECT_TRUE(contains(message, "Nesterov momentum needs a momentum > 0 and dampening 0"))
        << message;
  }
}

// Values torch's or DeepSpeed's optimizers refuse when they are built are
// refused when the file is read: a beta of 1, Lamb's min_coeff above
// max_coeff.
TEST(DeepSpeedJson, BetasOfOneAndLambCoefficientsOutOfOrderAreRefusedOnReading) {
  for (const char* betas : {"[1.0, 0.999]", "[0.9, 1]"}) {
    const std::string message = parse_error(
        std::string(R"({"optimizer": {"type": "AdamW", "params": {"betas": )") + betas + "}}}",
        "ds.json");
    EXPECT_TRUE(contains(message, "betas must be in [0, 1)")) << message;
  }
  const std::string lamb = parse_error(
      R"({"optimizer": {"type": "Lamb", "params": {"min_coeff": 5, "max_coeff": 2}}})",
      "ds.json");
  EXPECT_TRUE(contains(lamb, "min_coeff 5 is above max_coeff 2")) << lamb;
}

TEST(DeepSpeedJson, LegacyBfloat16BlockEnablesBf16) {
  Config c = parse_config_text(R"({"bfloat16": {"enabled": true}})", "ds.json");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
}

// torch_autocast is fp32 parameters with the forward pass under autocast:
// tandem's mixed_precision, in the block's dtype.
TEST(DeepSpeedJson, TorchAutocastSetsMixedPrecisionFromItsDtype) {
  auto mode = [](const std::string& block) {
    return parse_config_text(R"({"torch_autocast": )" + block + "}", "ds.json").mixed_precision;
  };
  EXPECT_EQ(mode(R"({"enabled": true, "dtype": "bfloat16"})"), MixedPrecision::kBf16);
  EXPECT_EQ(mode(R"({"enabled": true, "dtype": "torch.float16"})"), MixedPrecision::kFp16);
  EXPECT_EQ(mode(R"({"enabled": true, "dtype": "fp32"})"), MixedPrecision::kNo);
  EXPECT_EQ(mode(R"({"enabled": false, "dtype": "bf16"})"), MixedPrecision::kNo);
  // No dtype: torch.autocast's default for the device, bf16 on the CPU (the
  // Accelerator switches to fp16 when it trains on CUDA).
  const Config no_dtype = parse_config_text(R"({"torch_autocast": {"enabled": true}})", "ds.json");
  EXPECT_EQ(no_dtype.mixed_precision, MixedPrecision::kBf16);
  EXPECT_TRUE(no_dtype.autocast_device_default);
  EXPECT_EQ(mode(R"({"enabled": true}, "fp16": {"enabled": true})"), MixedPrecision::kFp16);
  Config with_block = parse_config_text(
      R"({"bf16": {"enabled": true}, "torch_autocast": {"enabled": true, "dtype": "bf16",
          "lower_precision_safe_modules": ["torch.nn.modules.linear.Linear"]}})", "ds.json");
  EXPECT_EQ(with_block.mixed_precision, MixedPrecision::kBf16);
  ASSERT_EQ(with_block.warnings.size(), 1u);
  EXPECT_TRUE(contains(with_block.warnings[0], "lower_precision_safe_modules"));
  EXPECT_TRUE(contains(parse_error(R"({"torch_autocast": {"enabled": true, "dtype": "fp16"},
                                      "bf16": {"enabled": true}})", "ds.json"),
                       "torch_autocast casts to fp16 but bf16.enabled is true"));
  EXPECT_TRUE(contains(parse_error(R"({"torch_autocast": {"enabled": true, "dtype": "int8"}})",
                                   "ds.json"),
                       "torch.autocast has no int8 mode"));
  EXPECT_TRUE(contains(parse_error(R"({"torch_autocast": {"enabled": true, "dtype": "fp8"}})",
                                   "ds.json"),
                       "torch_autocast.dtype"));
}

TEST(DeepSpeedJson, MonitorBlocksAreReadWithDeepSpeedsDefaults) {
  Config c = parse_config_text(
      R"({"csv_monitor": {"enabled": true, "output_path": "logs", "job_name": "run1"},
          "tensorboard": {"enabled": true}})", "ds.json");
  EXPECT_TRUE(c.csv_monitor.enabled);
  EXPECT_EQ(c.csv_monitor.dir(), "logs/run1");
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.dir(), "DeepSpeedJobName");
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_TRUE(contains(parse_error(R"({"csv_monitor": {"enabled": true, "path": "x"}})", "ds.json"),
                       "csv_monitor.path"));
}

TEST(DeepSpeedJson, DeprecatedCpuOffloadMeansOptimizerOffloadToCpu) {
  Config c = parse_config_text(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})",
                               "ds.json");
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
}

// Each offload block has its own pin_memory, as in DeepSpeed's models: a
// template's offload_param {device: none, pin_memory: false} must not turn
// pinning off for the optimizer's offload. The deprecated key sets both.
TEST(DeepSpeedJson, EachOffloadBlockKeepsItsOwnPinMemory) {
  for (const char* order :
       {R"({"zero_optimization": {"stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": true},
            "offload_param": {"device": "none", "pin_memory": false}}})",
        R"({"zero_optimization": {"stage": 3,
            "offload_param": {"device": "none", "pin_memory": false},
            "offload_optimizer": {"device": "cpu", "pin_memory": true}}})"}) {
    Config c = parse_config_text(order, "ds.json");
    EXPECT_TRUE(c.zero.offload_pin_memory) << order;
    EXPECT_FALSE(c.zero.offload_param_pin_memory) << order;
    Config back = parse_config_text(to_tandem_yaml(c), "back.yaml");
    EXPECT_TRUE(back.zero.offload_pin_memory);
    EXPECT_FALSE(back.zero.offload_param_pin_memory);
  }
  Config old = parse_config_text(
      R"({"zero_optimization": {"stage": 2, "cpu_offload": true, "cpu_offload_use_pin_memory": false}})",
      "ds.json");
  EXPECT_FALSE(old.zero.offload_pin_memory);
  EXPECT_FALSE(old.zero.offload_param_pin_memory);
}

// DeepSpeed's offload tuning keys say nothing at its defaults (ratio 1.0 is
// what tandem does) and warn away from them.
TEST(DeepSpeedJson, OffloadTuningKeysAreQuietAtDeepSpeedsDefaults) {
  Config quiet = parse_config_text(
      R"({"zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "cpu", "buffer_count": 4, "ratio": 1.0,
                                "fast_init": false, "pipeline_read": false},
          "offload_param": {"device": "cpu", "buffer_count": 5, "buffer_size": 1e8,
                            "max_in_cpu": 1e9}}})",
      "ds.json");
  EXPECT_EQ(warned_keys(quiet), std::vector<std::string>{});
  Config loud = parse_config_text(
      R"({"zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "cpu", "ratio": 0.3},
          "offload_param": {"device": "cpu", "buffer_count": 8}}})",
      "ds.json");
  EXPECT_EQ(warned_keys(loud), (std::vector<std::string>{
                                   "zero_optimization.offload_optimizer.ratio",
                                   "zero_optimization.offload_param.buffer_count"}));
}

// Adam settings tandem's Adam cannot follow would train something else:
// refused away from their defaults, quiet at them.
TEST(DeepSpeedJson, AdamsAmsgradAndUncorrectedBiasAreRefused) {
  for (const char* type : {"Adam", "AdamW"}) {
    const std::string head = std::string(R"({"optimizer": {"type": ")") + type +
                             R"(", "params": {"lr": 0.001, )";
    EXPECT_TRUE(contains(parse_error(head + R"("amsgrad": true}}})", "ds.json"),
                         "amsgrad: is not implemented"))
        << type;
    EXPECT_TRUE(contains(parse_error(head + R"("bias_correction": false}}})", "ds.json"),
                         "bias_correction: false is not implemented"))
        << type;
    EXPECT_EQ(warned_keys(parse_config_text(
                  head + R"("amsgrad": false, "bias_correction": true}}})", "ds.json")),
              std::vector<std::string>{});
  }
}

// DeepSpeed 0.19.8's keys: accepted (warned, or quiet at their defaults);
// what tandem cannot do is refused; each offload block refuses the other's
// keys, as DeepSpeed's models do.
TEST(DeepSpeedJson, ReadsDeepSpeed0198KeysAndRefusesWhatItCannotDo) {
  Config c = parse_config_text(
      R"({"gradient_allreduce_op": "mean", "disable_python_gc": true,
          "managed_gradient_accumulation": true, "vocabulary_size": 50304,
          "zero_optimization": {"stage": 2, "compute_grad_norm": true,
                                "offload_optimizer": {"device": "cpu", "super_offload": false}}})",
      "ds.json");
  EXPECT_EQ(c.zero.offload_optimizer, OffloadDevice::kCpu);
  ASSERT_EQ(c.warnings.size(), 1u);  // vocabulary_size only: the rest are at their defaults
  EXPECT_TRUE(contains(c.warnings[0], "vocabulary_size")) << c.warnings[0];
  EXPECT_TRUE(contains(parse_error(R"({"gradient_allreduce_op": "sum"})", "ds.json"),
                       "'sum' is not implemented: tandem averages gradients"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"offload_optimizer": {"buffer_size": 1}}})", "ds.json"),
      "is not a key of offload_optimizer"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"offload_param": {"ratio": 0.5}}})", "ds.json"),
      "is not a key of offload_param"));
}

// torch.optim's switches DeepSpeed passes through: quiet at their defaults,
// refused where ignoring them would train something else.
TEST(DeepSpeedJson, TorchOptimizerSwitchesAreQuietAtDefaultsAndRefusedOtherwise) {
  Config c = parse_config_text(
      R"({"optimizer": {"type": "AdamW", "params": {"maximize": false, "capturable": false,
          "differentiable": false, "fp32_optimizer_states": true, "set_grad_none": true,
          "decoupled_weight_decay": false}}})", "ds.json");
  EXPECT_TRUE(c.warnings.empty()) << c.warnings[0];
  EXPECT_TRUE(contains(parse_error(R"({"optimizer": {"type": "SGD", "params": {"maximize": true}}})",
                                   "ds.json"),
                       "gradient ascent is not implemented"));
  EXPECT_TRUE(contains(
      parse_error(R"({"optimizer": {"type": "Adam", "params": {"decoupled_weight_decay": true}}})",
                  "ds.json"),
      "write \"type\": \"AdamW\""));
  EXPECT_TRUE(contains(
      parse_error(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})", "ds.json"),
      "optimizer.params.max_grad_norm: DeepSpeed refuses it"));
  EXPECT_TRUE(contains(parse_error(R"({"allgather_size": 500000000})", "ds.json"),
                       "allgather_bucket_size"));
  EXPECT_EQ(warned_keys(parse_config_text(R"({"data_parallel_size": 2})", "ds.json")),
            (std::vector<std::string>{"data_parallel_size"}));
}

// DeepSpeed 0.19.8 still reads the old boolean form (get_zero_config ->
// read_zero_config_deprecated): true is stage 1 with the top-level
// allgather_size as its all-gather bucket, false is stage 0, and it warns.
TEST(DeepSpeedJson, DeprecatedZeroOptimizationFlagIsStage1OrStage0WithAWarning) {
  const Config on = parse_config_text(
      R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": true})", "ds.json");
  EXPECT_EQ(on.zero.stage, 1);
  ASSERT_EQ(on.warnings.size(), 1u);
  EXPECT_TRUE(contains(on.warnings[0], "ds.json:1:60: zero_optimization: true is DeepSpeed's "
                                       "deprecated form, read as ZeRO stage 1"))
      << on.warnings[0];
  EXPECT_TRUE(contains(on.warnings[0], "write \"zero_optimization\": {\"stage\": 1}"));

  const Config off = load_config_file(config_data("ds_zero_bool_false.json"));
  EXPECT_EQ(off.zero.stage, 0);
  ASSERT_EQ(off.warnings.size(), 1u);
  EXPECT_TRUE(contains(off.warnings[0], "zero_optimization: false is DeepSpeed's deprecated "
                                        "form, read as ZeRO stage 0"))
      << off.warnings[0];
  // Read, not a key tandem lacks (those warn as 'key').
  EXPECT_TRUE(warned_keys(off).empty());

  // allgather_size, in either order, is the stage-1 all-gather bucket.
  const Config bucket = load_config_file(config_data("ds_zero_bool_true.json"));
  EXPECT_EQ(bucket.zero.stage, 1);
  EXPECT_EQ(bucket.zero.allgather_bucket_size, 200000000);
  EXPECT_EQ(parse_config_text(R"({"allgather_size": 1000, "zero_optimization": true})", "ds.json")
                .zero.allgather_bucket_size,
            1000);
  EXPECT_TRUE(contains(parse_error(R"({"allgather_size": 0, "zero_optimization": true})",
                                   "ds.json"),
                       "allgather_size: expected a positive integer, got 0"));
}

TEST(DeepSpeedJson, WhatDeepSpeedRefusesOfTheZeroFlagStaysRefused) {
  // A quoted "true" or a number is not the flag: DeepSpeed fails on it.
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": "true"})", "ds.json"),
                       "zero_optimization: expected a mapping of keys"));
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": 1})", "ds.json"),
                       "zero_optimization: expected a mapping of keys"));
  // allgather_size anywhere else changes nothing in DeepSpeed.
  for (const char* text : {R"({"allgather_size": 500000000})",
                           R"({"allgather_size": 500000000, "zero_optimization": false})",
                           R"({"allgather_size": 5, "zero_optimization": {"stage": 1}})"}) {
    const std::string message = parse_error(text, "ds.json");
    EXPECT_TRUE(contains(message, "allgather_size: DeepSpeed reads it only beside the "
                                  "deprecated \"zero_optimization\": true"))
        << message;
    EXPECT_TRUE(contains(message, "allgather_bucket_size")) << message;
  }
  // Accelerate's DeepSpeedPlugin fails on the flag in a deepspeed_config_file.
  const std::string accelerate = testing::load_error("accelerate_ds_file_zero_bool.yaml");
  EXPECT_TRUE(contains(accelerate, "ds_zero_bool_true.json:1:60: zero_optimization: "
                                   "Accelerate's DeepSpeedPlugin reads zero_optimization.stage"))
      << accelerate;
  // tandem YAML has no deprecated form to keep.
  EXPECT_TRUE(contains(parse_error("zero_optimization: true\n", "t.yaml"),
                       "zero_optimization: expected a mapping of keys"));
}

TEST(DeepSpeedJson, LastBatchIterationIsReadForEveryType) {
  for (const char* type : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"}) {
    Config c = parse_config_text(fmt::format(R"({{"scheduler": {{"type": "{}", "params": )"
                                             R"({{"last_batch_iteration": 20}}}}}})",
                                             type),
                                 "ds.json");
    EXPECT_EQ(c.scheduler.params.at("last_batch_iteration"), 20.0) << type;
    EXPECT_TRUE(c.warnings.empty()) << type;
  }
  EXPECT_TRUE(contains(
      parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": -2}}})",
                  "ds.json"),
      "scheduler.params.last_batch_iteration"));
}

TEST(DeepSpeedJson, CountsWrittenWithExponentsMustBeWhole) {
  Config c = parse_config_text(R"({"zero_optimization": {"reduce_bucket_size": 5.0e8}})",
                               "ds.json");
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000'000);
  std::string message =
      parse_error(R"({"zero_optimization": {"sub_group_size": 2.5e-1}})", "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:1:42: zero_optimization.sub_group_size: expected a "
                                "positive integer, got 2.5e-1; set it to a whole number >= 1"));
}

TEST(DeepSpeedJson, EveryKeyGivenAValueHasItsLocationRecorded) {
  Config c = parse_config_text("{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\n"
                               "    \"stage\": 1\n  }\n}\n",
                               "ds.json");
  EXPECT_EQ(c.key_locations.at("train_batch_size"), "ds.json:2:23");
  EXPECT_EQ(c.key_locations.at("zero_optimization.stage"), "ds.json:4:14");
}

}  // namespace
}  // namespace tandem
