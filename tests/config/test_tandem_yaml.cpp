#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::contains;

// Writes `config` as tandem YAML and reads it back.
Config round_trip(const Config& config) {
  return parse_config_text(to_tandem_yaml(config), "written.yaml");
}

// A config with every field away from its default.
Config unusual_config() {
  Config c;
  c.distributed_type = DistributedType::kDeepSpeed;
  c.num_processes = 12;
  c.num_machines = 3;
  c.machine_rank = 2;
  c.main_process_ip = "node-7.cluster";
  c.main_process_port = 31000;
  c.gpu_ids = "1,3";
  c.use_cpu = true;
  c.rdzv_backend = "c10d";
  c.mixed_precision = MixedPrecision::kFp16;
  c.train_batch_size = 96;
  c.gradient_accumulation_steps = 4;
  c.gradient_clipping = 0.3;
  c.seed = 18446744073709551615ull;
  c.fp16 = {128.0, 10, 250, 4, true, 0.25, true};
  c.zero.stage = 3;
  c.zero.offload_optimizer = OffloadDevice::kCpu;
  c.zero.offload_param = OffloadDevice::kCpu;
  c.zero.offload_pin_memory = false;
  c.zero.reduce_bucket_size = 123'456'789;
  c.zero.stage3_prefetch_bucket_size = 13;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.stage3_max_live_parameters = 17;
  c.zero.zero3_init = true;
  c.optimizer = {};
  c.optimizer.type = "Adam";
  c.optimizer.lr = 0.1 + 0.2;
  c.optimizer.weight_decay = 1e-5;
  c.optimizer.eps = 1e-7;
  c.optimizer.beta1 = 0.875;
  c.scheduler.type = "OneCycle";
  c.scheduler.params = {{"cycle_min_lr", 1e-6}, {"cycle_first_step_size", 77},
                        {"cycle_momentum", 0.0}};
  c.scheduler.auto_params = {"cycle_max_lr"};
  c.ddp = {};
  c.ddp.bucket_cap_mb = 12.5;
  c.ddp.first_bucket_cap_mb = 0.5;
  c.ddp.find_unused_parameters = true;
  c.ddp.broadcast_buffers = false;
  c.ddp.comm_hook = "powersgd";
  c.ddp.cache_cpu_allocations = true;
  c.ddp.static_graph = true;
  c.ddp.powersgd = {4, 7, 1.5, false, false, 1e-8, 42};
  c.activation_checkpointing.enabled = true;
  c.cuda_graph = {true, 7, 2};
  c.preemption = {true, {"USR2", "HUP"}, "ck pt/dir", false, "false"};
  return c;
}

TEST(TandemYaml, ReadsEverySectionOfAHandWrittenFile) {
  Config c = load_config_file(config_data("tandem_full.yaml"));
  EXPECT_EQ(c.format, ConfigFormat::kTandemYaml);
  EXPECT_EQ(c.distributed_type, DistributedType::kMultiGpu);  // any case
  EXPECT_EQ(c.num_processes, 16);
  EXPECT_EQ(c.num_machines, 2);
  EXPECT_EQ(c.machine_rank, 1);
  EXPECT_EQ(c.main_process_ip, "10.1.0.5");
  EXPECT_EQ(c.main_process_port, 29600);
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_FALSE(c.train_batch_size.has_value());
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.seed, 1234u);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_EQ(c.zero.reduce_bucket_size, 50'000'000);  // 5e7 in YAML
  EXPECT_EQ(c.optimizer.type, "Adam");  // tandem's Adam is Adam
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.beta2, 0.98);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.scheduler.type, "WarmupCosineLR");
  EXPECT_EQ(c.scheduler.params.at("cos_min_ratio"), 0.1);
  EXPECT_EQ(c.scheduler.warmup_type, "log");
  EXPECT_EQ(c.ddp.bucket_cap_mb, 50.0);
  EXPECT_EQ(c.ddp.first_bucket_cap_mb, 2.5);
  EXPECT_TRUE(c.ddp.find_unused_parameters);
  EXPECT_FALSE(c.ddp.broadcast_buffers);
  EXPECT_EQ(c.ddp.comm_hook, "fp16");
  EXPECT_FALSE(c.ddp.cache_cpu_allocations) << "opt-in: off unless the file says true";
  EXPECT_TRUE(c.warnings.empty());
}

TEST(TandemYaml, DefaultsRoundTrip) {
  Config defaults;
  Config back = round_trip(defaults);
  EXPECT_EQ(back.format, ConfigFormat::kTandemYaml);
  EXPECT_TRUE(same_settings(back, defaults)) << to_tandem_yaml(defaults);
}

// What tandem writes must read back clean: a config that `tandem config`
// wrote and that then warns about its own keys on every launch teaches
// users to ignore warnings.
TEST(TandemYaml, WhatItWritesResolvesWithoutWarningsAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const auto type : {DistributedType::kNo, DistributedType::kMultiCpu,
                            DistributedType::kMultiGpu, DistributedType::kDeepSpeed}) {
      Config c;
      c.distributed_type = type;
      c.zero.stage = stage;
      const std::string yaml = to_tandem_yaml(c);
      const Config back = round_trip(c);
      EXPECT_TRUE(same_settings(back, c)) << yaml;
      const Config resolved = resolve_config(back, {}, {}, 2);
      EXPECT_TRUE(resolved.warnings.empty())
          << "stage " << stage << ": " << fmt::format("{}", fmt::join(resolved.warnings, "\n"))
          << "\n" << yaml;
    }
  }
  // A stage-3 limit set below stage 3 is still written, and still warned
  // about: it has no effect there.
  Config set;
  set.zero.stage = 1;
  set.zero.stage3_max_live_parameters = 17;
  const Config back = round_trip(set);
  EXPECT_EQ(back.zero.stage3_max_live_parameters, 17);
  EXPECT_EQ(resolve_config(back, {}, {}, 2).warnings.size(), 1u);
}

TEST(TandemYaml, EveryFieldRoundTrips) {
  Config original = unusual_config();
  Config back = round_trip(original);
  EXPECT_TRUE(same_settings(back, original)) << to_tandem_yaml(original) << "\nread back as\n"
                                             << to_tandem_yaml(back);
}

TEST(TandemYaml, ReadsPowerSGDAndStaticGraph) {
  Config c = parse_config_text(R"(ddp:
  comm_hook: powersgd
  static_graph: true
  powersgd:
    matrix_approximation_rank: 2
    start_powerSGD_iter: 100
    min_compression_rate: 1.5
    use_error_feedback: false
    warm_start: false
    orthogonalization_epsilon: 1.0e-8
    random_seed: 7
)",
                               "t.yaml");
  EXPECT_EQ(c.ddp.comm_hook, "powersgd");
  EXPECT_TRUE(c.ddp.static_graph);
  EXPECT_EQ(c.ddp.powersgd.matrix_approximation_rank, 2);
  EXPECT_EQ(c.ddp.powersgd.start_powerSGD_iter, 100);
  EXPECT_EQ(c.ddp.powersgd.min_compression_rate, 1.5);
  EXPECT_FALSE(c.ddp.powersgd.use_error_feedback);
  EXPECT_FALSE(c.ddp.powersgd.warm_start);
  EXPECT_EQ(c.ddp.powersgd.orthogonalization_epsilon, 1e-8);
  EXPECT_EQ(c.ddp.powersgd.random_seed, 7u);
  EXPECT_TRUE(c.warnings.empty());
  // Defaults: PyTorch's PowerSGDState defaults, static_graph off.
  Config defaults = parse_config_text("ddp:\n  comm_hook: powersgd\n", "t.yaml");
  EXPECT_FALSE(defaults.ddp.static_graph);
  EXPECT_EQ(defaults.ddp.powersgd.matrix_approximation_rank, 1);
  EXPECT_EQ(defaults.ddp.powersgd.start_powerSGD_iter, 1000);
  EXPECT_EQ(defaults.ddp.powersgd.min_compression_rate, 2.0);
  EXPECT_TRUE(defaults.ddp.powersgd.use_error_feedback);
  EXPECT_TRUE(defaults.ddp.powersgd.warm_start);
}

TEST(TandemYaml, PowerSGDBlockWithAnotherHookWarnsThatItHasNoEffect) {
  Config c = parse_config_text("ddp:\n  comm_hook: bf16\n  powersgd:\n    warm_start: false\n",
                               "t.yaml");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "t.yaml:4:5: 'ddp.powersgd' has no effect: ddp.comm_hook "
                                      "is 'bf16'; set comm_hook: powersgd"))
      << c.warnings[0];
  // An empty block sets nothing, and says nothing.
  EXPECT_TRUE(parse_config_text("ddp:\n  comm_hook: bf16\n  powersgd: {}\n", "t.yaml")
                  .warnings.empty());
}

TEST(TandemYaml, SgdAndWarmupLrRoundTrip) {
  Config original;
  original.optimizer.type = "SGD";
  original.optimizer.lr = 0.5;
  original.optimizer.weight_decay = 0.0;
  original.optimizer.momentum = 0.9;
  original.scheduler.type = "WarmupLR";
  original.scheduler.warmup_type = "linear";
  original.scheduler.params = {{"warmup_num_steps", 10}};
  EXPECT_TRUE(same_settings(round_trip(original), original)) << to_tandem_yaml(original);
}

TEST(TandemYaml, EveryOptimizerTypesParamsRoundTrip) {
  Config adagrad;
  adagrad.optimizer.type = "Adagrad";
  adagrad.optimizer.lr = 0.1;
  adagrad.optimizer.lr_decay = 0.01;
  adagrad.optimizer.initial_accumulator_value = 0.5;
  adagrad.optimizer.eps = 1e-9;
  Config rmsprop;
  rmsprop.optimizer.type = "RMSprop";
  rmsprop.optimizer.alpha = 0.9;
  rmsprop.optimizer.momentum = 0.5;
  rmsprop.optimizer.centered = true;
  Config lion;
  lion.optimizer.type = "Lion";
  lion.optimizer.lr = 1e-4;
  lion.optimizer.beta1 = 0.95;
  lion.optimizer.beta2 = 0.98;
  lion.optimizer.weight_decay = 0.1;
  Config lamb;
  lamb.optimizer.type = "Lamb";
  lamb.optimizer.bias_correction = false;
  lamb.optimizer.eps_inside_sqrt = true;
  lamb.optimizer.max_coeff = 5;
  lamb.optimizer.min_coeff = 0.1;
  for (const Config& original : {adagrad, rmsprop, lion, lamb}) {
    EXPECT_TRUE(same_settings(round_trip(original), original)) << to_tandem_yaml(original);
  }
}

TEST(TandemYaml, DeepSpeedOptimizerTypesReadTheirParams) {
  const Config lamb = parse_config_text(
      R"({"optimizer": {"type": "lamb", "params": {"lr": 0.01, "betas": [0.8, 0.9],
          "eps_inside_sqrt": true, "max_coeff": 3, "min_coeff": 0.5, "bias_correction": false}}})",
      "ds.json");
  EXPECT_EQ(lamb.optimizer.type, "Lamb");
  EXPECT_EQ(lamb.optimizer.beta1, 0.8);
  EXPECT_EQ(lamb.optimizer.eps_inside_sqrt, true);
  EXPECT_EQ(lamb.optimizer.max_coeff, 3.0);
  EXPECT_EQ(lamb.optimizer.min_coeff, 0.5);
  EXPECT_EQ(lamb.optimizer.bias_correction, false);
  const Config rmsprop = parse_config_text(
      R"({"optimizer": {"type": "RMSprop", "params": {"alpha": 0.9, "centered": true,
          "momentum": 0.3}}})",
      "ds.json");
  EXPECT_EQ(rmsprop.optimizer.alpha, 0.9);
  EXPECT_EQ(rmsprop.optimizer.centered, true);
  EXPECT_EQ(rmsprop.optimizer.momentum, 0.3);
  // A key of another type is refused with the type named.
  EXPECT_TRUE(contains(testing::parse_error(R"({"optimizer": {"type": "Lion", "params":
      {"eps": 1e-8}}})", "ds.json"), "for Lion"));
}

TEST(TandemYaml, SameSettingsNoticesASingleChangedField) {
  Config a = unusual_config();
  Config b = a;
  b.zero.stage3_max_live_parameters = 1;
  EXPECT_FALSE(same_settings(a, b));
  b = a;
  b.scheduler.auto_params.clear();
  EXPECT_FALSE(same_settings(a, b));
  b = a;
  b.warnings.push_back("provenance only");
  b.source_path = "elsewhere.yaml";
  EXPECT_TRUE(same_settings(a, b));
}

TEST(TandemYaml, EachDataFileSurvivesConversionToTandemYaml) {
  for (const char* file : {"accelerate_multi_cpu.yaml", "accelerate_deepspeed.yaml",
                           "accelerate_ds_file.yaml", "ds_zero2_offload.json",
                           "ds_zero3_onecycle.json", "ds_hf_auto.json", "tandem_full.yaml",
                           "ds_trainer_zero3_auto.json", "ds_zero3_small_buckets.json",
                           "accelerate_multi_node.yaml", "accelerate_no_with_processes.yaml",
                           "accelerate_zero2_questionnaire.yaml",
                           "accelerate_multi_cpu_minimal.yaml",
                           "accelerate_ds_file_zero_no_stage.yaml", "ds_legacy_cpu_offload.json",
                           "ds_micro_accum_fp16.json", "ds_train_and_accum.json"}) {
    Config original = load_config_file(config_data(file));
    Config back = round_trip(original);
    EXPECT_TRUE(same_settings(back, original)) << file << "\n" << to_tandem_yaml(original);
  }
}

TEST(TandemYaml, AutoSizesAreWrittenAsAuto) {
  Config c = load_config_file(config_data("ds_hf_auto.json"));
  std::string text = to_tandem_yaml(c);
  EXPECT_TRUE(contains(text, "  reduce_bucket_size: auto\n"));
  EXPECT_TRUE(contains(text, "gradient_clipping: auto\n"));
  EXPECT_TRUE(contains(text, "train_batch_size: auto\n"));
  EXPECT_TRUE(contains(text, "    lr: auto\n"));
  EXPECT_EQ(round_trip(c).auto_keys.count("zero_optimization.reduce_bucket_size"), 1u);
}

TEST(TandemYaml, WrittenTextIsReadAsTandemYamlNotAccelerate) {
  std::string text = to_tandem_yaml(unusual_config());
  EXPECT_FALSE(contains(text, "distributed_type"));
  EXPECT_TRUE(contains(text, "distributed: DEEPSPEED\n"));
}

TEST(TandemYaml, NullOptionalsReadAsUnset) {
  Config c = parse_config_text("num_processes: auto\nmain_process_port: null\nseed: ~\n"
                               "main_process_ip:\n",
                               "t.yaml");
  EXPECT_FALSE(c.num_processes.has_value());
  EXPECT_FALSE(c.main_process_port.has_value());
  EXPECT_FALSE(c.seed.has_value());
  EXPECT_EQ(c.main_process_ip, "");
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(TandemYaml, ReadsTheCudaGraphBlockAndRefusesAnUnknownKey) {
  Config c = parse_config_text("cuda_graph:\n  enabled: true\n  warmup_steps: 5\n  max_captures: 2\n",
                               "t.yaml");
  EXPECT_TRUE(c.cuda_graph.enabled);
  EXPECT_EQ(c.cuda_graph.warmup_steps, 5);
  EXPECT_EQ(c.cuda_graph.max_captures, 2);
  EXPECT_FALSE(parse_config_text("seed: 1\n", "t.yaml").cuda_graph.enabled);
  try {
    parse_config_text("cuda_graph:\n  enable: true\n", "t.yaml");
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("enable"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config_text("cuda_graph:\n  warmup_steps: 0\n", "t.yaml"), UsageError);
}

TEST(TandemYaml, ReadsThePreemptionBlockAndRefusesWhatCannotWork) {
  Config c = parse_config_text(
      "preemption:\n  enabled: true\n  signals: [sigusr1, Term]\n  checkpoint_dir: ckpt\n"
      "  requeue: true\n",
      "t.yaml");
  EXPECT_TRUE(c.preemption.enabled);
  EXPECT_EQ(c.preemption.signals, (std::vector<std::string>{"USR1", "TERM"}));
  EXPECT_EQ(c.preemption.checkpoint_dir, "ckpt");
  EXPECT_TRUE(c.preemption.save);
  EXPECT_EQ(c.preemption.requeue, "true");
  EXPECT_EQ(parse_config_text("preemption:\n  requeue: auto\n", "t.yaml").preemption.requeue,
            "auto");
  const Config defaults = parse_config_text("seed: 1\n", "t.yaml");
  EXPECT_FALSE(defaults.preemption.enabled);
  EXPECT_EQ(defaults.preemption.signals, (std::vector<std::string>{"USR1", "TERM"}));
  for (const char* bad :
       {"preemption:\n  signals: [KILL]\n", "preemption:\n  signals: []\n",
        "preemption:\n  requeue: maybe\n", "preemption:\n  checkpoint: x\n",
        "preemption: true\n"}) {
    EXPECT_THROW(parse_config_text(bad, "t.yaml"), UsageError) << bad;
  }
  try {
    parse_config_text("preemption:\n  signals: [USR1, STOP]\n", "t.yaml");
    ADD_FAILURE() << "SIGSTOP was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'STOP' is not a signal"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("t.yaml:2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
