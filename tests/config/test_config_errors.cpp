// Every class of bad config gives "FILE:LINE:COL: key.path: what; fix".

#include <gtest/gtest.h>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::config_data;
using testing::config_data_dir;
using testing::contains;
using testing::parse_error;
using testing::usage_error;

TEST(ConfigErrors, WrongTypeNamesFileLineColumnKeyPathAndFix) {
  std::string message = parse_error(R"({
  "train_batch_size": 16,
  "zero_optimization": {
    "stage": "three"
  }
})",
                                    "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:4:14: zero_optimization.stage: expected an integer "
                                "0..3, got \"three\"; set it to 0, 1, 2 or 3"));
}

TEST(ConfigErrors, OutOfRangeEnumIntegerIsRefused) {
  std::string message = parse_error("zero_optimization:\n  stage: 4\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:2:10: zero_optimization.stage: expected an integer "
                                "0..3, got 4; set it to 0, 1, 2 or 3"));
}

TEST(ConfigErrors, MisspelledKeyGetsDidYouMean) {
  std::string message = parse_error("{\n  \"zero_optimization\": {\"stgae\": 2}\n}", "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:2:25: zero_optimization.stgae: unknown key; did you "
                                "mean 'stage'?"));
}

TEST(ConfigErrors, ShortenedKeyGetsTheFullName) {
  std::string message = parse_error(R"({"train_micro_batch_size": 4})", "ds.json");
  EXPECT_TRUE(contains(message, "train_micro_batch_size: unknown key; did you mean "
                                "'train_micro_batch_size_per_gpu'?"));
}

TEST(ConfigErrors, UnknownKeyFarFromAnyNameListsTheValidOnes) {
  std::string message = parse_error("ddp:\n  xyzzy: 1\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:2:3: ddp.xyzzy: unknown key; remove it; keys tandem "
                                "reads here: bucket_cap_mb, first_bucket_cap_mb, "
                                "find_unused_parameters, broadcast_buffers, comm_hook, "
                                "cache_cpu_allocations, static_graph and powersgd"));
}

TEST(ConfigErrors, PowerSGDSettingsAreCheckedWhereTheyAre) {
  std::string message =
      parse_error("ddp:\n  comm_hook: powersgd\n  powersgd:\n    matrix_approximation_rank: 0\n",
                  "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:4:32: ddp.powersgd.matrix_approximation_rank: "))
      << message;
  message = parse_error("ddp:\n  powersgd:\n    start_powerSGD_iter: 1\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:3:26: ddp.powersgd.start_powerSGD_iter: 1 is below 2, the "
                                "least PowerSGD allows with use_error_feedback; set it to 2 or "
                                "more"))
      << message;
  // Without error feedback and warm start, PyTorch allows it too.
  Config c = parse_config_text(
      "ddp:\n  comm_hook: powersgd\n  powersgd:\n    start_powerSGD_iter: 0\n"
      "    use_error_feedback: false\n    warm_start: false\n",
      "t.yaml");
  EXPECT_EQ(c.ddp.powersgd.start_powerSGD_iter, 0);
  message = parse_error("ddp:\n  powersgd:\n    warmstart: true\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:3:5: ddp.powersgd.warmstart: unknown key; did you mean "
                                "'warm_start'?"))
      << message;
  message = parse_error("ddp:\n  comm_hook: powersdg\n", "t.yaml");
  EXPECT_TRUE(contains(message, "ddp.comm_hook")) << message;
  EXPECT_TRUE(contains(message, "powersgd")) << message;
  message = parse_error("ddp:\n  static_graph: sometimes\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:2:17: ddp.static_graph: ")) << message;
}

TEST(ConfigErrors, UnknownSchedulerParameterGetsDidYouMeanForItsType) {
  std::string message = parse_error(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_step": 10}}})", "ds.json");
  EXPECT_TRUE(contains(message, "scheduler.params.warmup_num_step: unknown key for WarmupLR; "
                                "did you mean 'warmup_num_steps'?"));
  // total_num_steps belongs to WarmupDecayLR and WarmupCosineLR, not WarmupLR.
  message = parse_error(
      R"({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})", "ds.json");
  EXPECT_TRUE(contains(message, "scheduler.params.total_num_steps: unknown key for WarmupLR"));
}

TEST(ConfigErrors, TruncatedJsonFileSaysItEndsEarly) {
  std::string path = config_data("ds_truncated.json");
  std::string message = usage_error([&] { load_config_file(path); });
  EXPECT_TRUE(contains(message, path + ":5:39: malformed JSON:"));
  EXPECT_TRUE(contains(message, "is the file truncated?"));
}

TEST(ConfigErrors, JsonCutAfterACompleteValueSaysItEndsEarly) {
  std::string message = parse_error("{\n  \"train_batch_size\": 32,\n", "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:3:1: malformed JSON: syntax error while parsing "
                                "object key - unexpected end of input"));
  EXPECT_TRUE(contains(message, "is the file truncated?"));
}

TEST(ConfigErrors, MalformedJsonPointsAtTheBadCharacter) {
  // (A trailing comma is fine: DeepSpeed's hjson reader takes it.)
  std::string message = parse_error("{\n  \"steps_per_print\": 10,\n  'seed': 1\n}\n", "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:3:3: malformed JSON:")) << message;
  EXPECT_TRUE(contains(message, "keys and strings in double quotes")) << message;
}

TEST(ConfigErrors, MalformedYamlPointsAtTheProblem) {
  std::string message =
      parse_error("seed: 1\noptimizer:\n  type: AdamW\n  params: {lr: 0.1\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:"));
  EXPECT_TRUE(contains(message, "malformed YAML: end of map flow not found"));
}

TEST(ConfigErrors, EmptyFileAndCommentOnlyFileAreRefused) {
  EXPECT_TRUE(contains(parse_error("", "t.yaml"), "t.yaml:1:1: the file is empty"));
  EXPECT_TRUE(contains(parse_error("  \n\n", "t.yaml"), "t.yaml:1:1: the file is empty"));
  EXPECT_TRUE(contains(parse_error("# nothing yet\n", "t.yaml"), "t.yaml:1:1: the file is empty"));
}

TEST(ConfigErrors, YamlListInsteadOfMappingIsRefused) {
  std::string message = parse_error("- num_processes: 2\n- seed: 1\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:1:1: (top level): expected a mapping of keys, got a "
                                "list; a config is a mapping of `key: value` lines"));
  EXPECT_TRUE(contains(parse_error("[1, 2]", "ds.json"),
                       "ds.json:1:1: (top level): expected a mapping of keys, got a list"));
}

TEST(ConfigErrors, ZeroOrNegativeSizesAndCountsAreRefused) {
  EXPECT_TRUE(contains(parse_error(R"({"train_batch_size": 0})", "ds.json"),
                       "ds.json:1:22: train_batch_size: expected a positive integer, got 0"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"allgather_bucket_size": 0}})", "ds.json"),
      "zero_optimization.allgather_bucket_size: expected a positive integer, got 0"));
  // In tandem YAML reduce_bucket_size may be 0 (a bucket per gradient), not
  // negative; DeepSpeed JSON refuses 0 too, as DeepSpeed does.
  EXPECT_TRUE(contains(parse_error("zero_optimization:\n  reduce_bucket_size: -5\n", "t.yaml"),
                       "zero_optimization.reduce_bucket_size: expected an integer >= 0, got -5"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"reduce_bucket_size": -5}})", "ds.json"),
      "zero_optimization.reduce_bucket_size: expected a positive integer, got -5"));
  EXPECT_TRUE(contains(parse_error("ddp:\n  bucket_cap_mb: 0\n", "t.yaml"),
                       "t.yaml:2:18: ddp.bucket_cap_mb: expected a number > 0, got 0"));
  EXPECT_TRUE(contains(parse_error("num_machines: -1\n", "t.yaml"),
                       "num_machines: expected an integer 1..16777216, got -1"));
  EXPECT_TRUE(contains(parse_error("gradient_clipping: -1.0\n", "t.yaml"),
                       "gradient_clipping: expected a number >= 0, got -1.0"));
}

TEST(ConfigErrors, Fp16AndBf16BothEnabledIsRefused) {
  std::string message = parse_error(R"({
  "fp16": {"enabled": true},
  "bf16": {"enabled": true}
})",
                                    "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:3:23: bf16.enabled: fp16 and bf16 are both enabled "
                                "(fp16.enabled is true too); enable only one of them"));
  // Either order, and "auto" in one of them is fine.
  EXPECT_TRUE(contains(parse_error(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})",
                                   "ds.json"),
                       "fp16.enabled: fp16 and bf16 are both enabled (bf16.enabled is true too)"));
  Config c = parse_config_text(R"({"bf16": {"enabled": true}, "fp16": {"enabled": "auto"}})",
                               "ds.json");
  EXPECT_EQ(c.mixed_precision, MixedPrecision::kBf16);
}

TEST(ConfigErrors, QuotedNumbersAndBooleansAreRefusedWithTheFix) {
  EXPECT_TRUE(contains(parse_error(R"({"train_batch_size": "32"})", "ds.json"),
                       "train_batch_size: expected a positive integer, got \"32\"; write it "
                       "without quotes"));
  EXPECT_TRUE(contains(parse_error(R"({"wall_clock_breakdown": "true"})", "ds.json"),
                       "wall_clock_breakdown: expected true or false, got \"true\"; write it "
                       "without quotes"));
}

TEST(ConfigErrors, BadEnumValuesSuggestTheNearestOne) {
  EXPECT_TRUE(contains(parse_error("distributed_type: MULTI_GPUS\n", "a.yaml"),
                       "a.yaml:1:19: distributed_type: unknown distributed_type \"MULTI_GPUS\"; "
                       "did you mean MULTI_GPU?"));
  EXPECT_TRUE(contains(parse_error("mixed_precision: fp32\n", "t.yaml"),
                       "t.yaml:1:18: mixed_precision: expected \"no\", \"bf16\" or \"fp16\", got "
                       "\"fp32\"; did you mean \"fp16\"?"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})", "ds.json"),
      "zero_optimization.offload_optimizer.device: expected \"none\" or \"cpu\", got \"gpu\""));
  EXPECT_TRUE(contains(parse_error(R"({"optimizer": {"type": "Adamm"}})", "ds.json"),
                       "optimizer.type: unknown optimizer \"Adamm\"; did you mean \"Adam\"?"));
  EXPECT_TRUE(contains(parse_error(R"({"scheduler": {"type": "WarmupCosine"}})", "ds.json"),
                       "did you mean \"WarmupCosineLR\"?"));
  EXPECT_TRUE(contains(
      parse_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
                  "ds.json"),
      "scheduler.params.warmup_type: expected \"log\" or \"linear\", got \"cosine\""));
}

TEST(ConfigErrors, UnsupportedButRealChoicesSaySo) {
  EXPECT_TRUE(contains(parse_error(R"({"optimizer": {"type": "OneBitAdam"}})", "ds.json"),
                       "optimizer.type: DeepSpeed's optimizer \"OneBitAdam\" is not available "
                       "in tandem; use Adam, AdamW, SGD, Adagrad, RMSprop, Lion or Lamb"));
  EXPECT_TRUE(contains(
      parse_error(R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})", "ds.json"),
      "zero_optimization.offload_param.device: NVMe offload is not supported by tandem; use "
      "\"cpu\" or \"none\""));
  EXPECT_TRUE(contains(parse_error("distributed_type: XLA\n", "a.yaml"),
                       "Accelerate's XLA is not supported by tandem"));
  EXPECT_TRUE(contains(parse_error("mixed_precision: fp8\n", "t.yaml"),
                       "fp8 mixed precision is not supported by tandem"));
}

// tandem's nodes meet at its own store: an etcd rendezvous is refused where
// the file is read, so that `tandem config check` and `tandem launch` agree,
// and a misspelt backend is offered only what tandem accepts.
TEST(ConfigErrors, RdzvBackendOtherThanStaticOrC10dIsRefusedWhereTheFileIsRead) {
  for (const char* backend : {"etcd", "etcd-v2", "ETCD"}) {
    const std::string message = parse_error(
        std::string("distributed_type: MULTI_CPU\nrdzv_backend: ") + backend + "\n", "a.yaml");
    EXPECT_TRUE(contains(message, "a.yaml:2:15: rdzv_backend: ")) << message;
    EXPECT_TRUE(contains(message, "is not supported by tandem: the nodes meet at tandem's own "
                                  "TCP store")) << message;
    EXPECT_TRUE(contains(message, "set it to \"c10d\"")) << message;
  }
  EXPECT_TRUE(contains(parse_error("rdzv_backend: etcd\n", "t.yaml"),
                       "t.yaml:1:15: rdzv_backend: etcd is not supported by tandem"));
  const std::string foo = parse_error("distributed_type: MULTI_CPU\nrdzv_backend: foo\n", "a.yaml");
  EXPECT_TRUE(contains(foo, "rdzv_backend: expected \"static\" or \"c10d\", got \"foo\"")) << foo;
  EXPECT_FALSE(contains(foo, "etcd")) << foo;
  EXPECT_EQ(parse_config_text("rdzv_backend: C10D\n", "t.yaml").rdzv_backend, "c10d");
}

TEST(ConfigErrors, KeyGivenTwiceIsRefused) {
  std::string message = parse_error("{\n  \"steps_per_print\": 1,\n  \"steps_per_print\": 2\n}",
                                    "ds.json");
  EXPECT_TRUE(contains(message, "ds.json:3:3: steps_per_print: given twice (first at line 2); "
                                "keep one of them"));
}

TEST(ConfigErrors, MissingDeepSpeedConfigFileNamesItAndTheYamlKey) {
  std::string message = parse_error(
      "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope.json\n",
      "a.yaml", config_data_dir());
  EXPECT_TRUE(contains(message, "a.yaml:3:26: deepspeed_config.deepspeed_config_file: cannot "
                                "read \"" + config_data_dir() + "/nope.json\""));
  EXPECT_TRUE(contains(message, "relative path is taken from the folder of this YAML file"));
}

TEST(ConfigErrors, ErrorsInsideTheDeepSpeedConfigFileNameThatFile) {
  testing::TempFolder dir;
  ASSERT_FALSE(dir.path().empty());
  dir.write("bad_ds.json", "{\"zero_optimization\": {\"stage\": 7}}");
  std::string message = parse_error(
      "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: bad_ds.json\n",
      "a.yaml", dir.path());
  EXPECT_TRUE(contains(message, "bad_ds.json:1:33: zero_optimization.stage: expected an "
                                "integer 0..3, got 7"));
}

TEST(ConfigErrors, TandemKeysInAnAccelerateFileExplainTheFormatChoice) {
  std::string message = parse_error("distributed_type: MULTI_GPU\nzero_optimization:\n  stage: 1\n",
                                    "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:2:1: zero_optimization: unknown key in an Accelerate "
                                "config"));
  EXPECT_TRUE(contains(message, "tandem's own YAML names the type `distributed:`"));
}

TEST(ConfigErrors, HalfPrecisionBlocksInTandemYamlPointToMixedPrecision) {
  EXPECT_TRUE(contains(parse_error("fp16:\n  enabled: true\n", "t.yaml"),
                       "t.yaml:2:3: fp16.enabled: unknown key (tandem YAML turns half precision "
                       "on with the top-level key mixed_precision: bf16 or fp16)"));
  EXPECT_TRUE(contains(parse_error("bf16:\n  enabled: true\n", "t.yaml"),
                       "bf16: unknown key (tandem YAML turns half precision on"));
}

TEST(ConfigErrors, MachineRankMustBeBelowNumMachines) {
  std::string message = parse_error("num_machines: 2\nmachine_rank: 2\n", "t.yaml");
  EXPECT_TRUE(contains(message, "t.yaml:2:15: machine_rank: 2 is not below num_machines 2"));
  message = parse_error("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 3\n",
                        "a.yaml");
  EXPECT_TRUE(contains(message, "a.yaml:3:16: num_processes: 3 processes do not split evenly "
                                "over num_machines 2"));
}

TEST(ConfigErrors, MissingFileAndFolderAreRefused) {
  EXPECT_TRUE(contains(usage_error([] { load_config_file("/no/such/tandem.yaml"); }),
                       "/no/such/tandem.yaml: cannot read the config file (No such file or "
                       "directory)"));
  EXPECT_TRUE(contains(usage_error([] { load_config_file(config_data_dir()); }),
                       "is a folder, not a config file"));
}

TEST(ConfigErrors, AcceleratorConfigWithoutDistributedTypeIsRefused) {
  EXPECT_TRUE(contains(parse_error("compute_environment: LOCAL_MACHINE\nnum_processes: 2\n",
                                   "a.yaml"),
                       "a.yaml:1:1: (top level): distributed_type is missing"));
}

}  // namespace
}  // namespace tandem
