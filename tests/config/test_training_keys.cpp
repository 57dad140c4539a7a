// Keys that change how training runs (issue 33, items 2 and 4): ZeRO's
// communication knobs, the 16-bit save switch, Accelerate's debug and
// enable_cpu_affinity, and the "auto" sizes filled from a hidden size as
// Accelerate fills them (its own formulas, evaluated by
// tests/config/accelerate_auto_sizes.py, are the reference).

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::contains;
using testing::parse_error;

TEST(TrainingKeys, DeepSpeedZeroCommunicationKeysAreReadWithoutWarnings) {
  Config c = parse_config_text(R"({"zero_optimization": {"stage": 2, "reduce_scatter": false,
      "overlap_comm": false, "allgather_bucket_size": 123}})", "ds.json");
  EXPECT_FALSE(c.zero.reduce_scatter);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.allgather_bucket_size, 123);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  Config defaults = parse_config_text(R"({"zero_optimization": {"stage": 2}})", "ds.json");
  EXPECT_TRUE(defaults.zero.reduce_scatter);
  EXPECT_TRUE(defaults.zero.overlap_comm);
  EXPECT_EQ(defaults.zero.allgather_bucket_size, 500'000'000);
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": {"allgather_bucket_size": 0}})",
                                   "ds.json"),
                       "zero_optimization.allgather_bucket_size"));
  EXPECT_TRUE(contains(parse_error(R"({"zero_optimization": {"overlap_comm": "yes"}})", "ds.json"),
                       "zero_optimization.overlap_comm"));
}

TEST(TrainingKeys, TandemYamlTakesTheSameZeroKeysAndWritesThemBack) {
  Config c = parse_config_text("zero_optimization:\n  stage: 3\n  reduce_scatter: false\n"
                               "  overlap_comm: false\n  allgather_bucket_size: 77\n"
                               "  stage3_gather_16bit_weights_on_model_save: true\n"
                               "enable_cpu_affinity: true\ndebug: true\n",
                               "t.yaml");
  EXPECT_FALSE(c.zero.reduce_scatter);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.allgather_bucket_size, 77);
  EXPECT_EQ(c.zero.gather_16bit_weights_on_model_save, std::optional<bool>(true));
  EXPECT_TRUE(c.enable_cpu_affinity);
  EXPECT_TRUE(c.debug);
  Config again = parse_config_text(to_tandem_yaml(c), "again.yaml");
  EXPECT_TRUE(same_settings(c, again)) << to_tandem_yaml(c);
}

TEST(TrainingKeys, Gather16BitOnSaveHasThreeSpellingsAndAccelerateNamesItToo) {
  for (const char* key : {"stage3_gather_16bit_weights_on_model_save",
                          "stage3_gather_fp16_weights_on_model_save",
                          "gather_16bit_weights_on_model_save"}) {
    for (bool value : {true, false}) {
      Config c = parse_config_text(std::string(R"({"zero_optimization": {"stage": 3, ")") + key +
                                       "\": " + (value ? "true" : "false") + "}}",
                                   "ds.json");
      EXPECT_EQ(c.zero.gather_16bit_weights_on_model_save, std::optional<bool>(value)) << key;
      EXPECT_TRUE(c.warnings.empty()) << key;
    }
  }
  EXPECT_FALSE(parse_config_text(R"({"zero_optimization": {"stage": 3}})", "ds.json")
                   .zero.gather_16bit_weights_on_model_save.has_value());
  Config acc = parse_config_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                 "  zero_stage: 3\n  zero3_save_16bit_model: true\n",
                                 "a.yaml");
  EXPECT_EQ(acc.zero.gather_16bit_weights_on_model_save, std::optional<bool>(true));
  EXPECT_TRUE(acc.warnings.empty());
}

TEST(TrainingKeys, AccelerateDebugAndCpuAffinityAreReadAndDowncastBf16SaysWhy) {
  Config c = parse_config_text("distributed_type: MULTI_CPU\ndebug: true\n"
                               "enable_cpu_affinity: true\ndowncast_bf16: 'yes'\n",
                               "a.yaml");
  EXPECT_TRUE(c.debug);
  EXPECT_TRUE(c.enable_cpu_affinity);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_TRUE(contains(c.warnings[0], "downcast_bf16"));
  EXPECT_TRUE(contains(c.warnings[0], "XLA_DOWNCAST_BF16"));
  Config quiet = parse_config_text("distributed_type: MULTI_CPU\ndebug: false\n"
                                   "enable_cpu_affinity: false\ndowncast_bf16: 'no'\n",
                                   "a.yaml");
  EXPECT_FALSE(quiet.debug);
  EXPECT_FALSE(quiet.enable_cpu_affinity);
  EXPECT_TRUE(quiet.warnings.empty());
}

// Accelerate's values for each hidden size, from its own source.
std::map<int64_t, std::map<std::string, int64_t>> training_keys_accelerate_reference(
    const std::vector<int64_t>& hidden_sizes, int* status) {
  std::string command = std::string(TANDEM_PEER_PYTHON) + " " + TANDEM_SOURCE_DIR +
                        "/tests/config/accelerate_auto_sizes.py";
  for (int64_t h : hidden_sizes) command += " " + std::to_string(h);
  std::map<int64_t, std::map<std::string, int64_t>> out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) text += buffer;
  const int raw = ::pclose(pipe);
  *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::istringstream lines(text);
  int64_t h = 0;
  std::string key;
  int64_t value = 0;
  while (lines >> h >> key >> value) out[h][key] = value;
  return out;
}

TEST(TrainingKeys, AutoSizesFromTheHiddenSizeMatchAccelerate) {
  const std::vector<int64_t> sizes = {1, 3, 7, 10, 768, 1000, 4096, 5120, 12288};
  int status = 0;
  auto reference = training_keys_accelerate_reference(sizes, &status);
  if (status == 77) GTEST_SKIP() << "accelerate is not importable from " << TANDEM_PEER_PYTHON;
  ASSERT_EQ(status, 0);
  ASSERT_EQ(reference.size(), sizes.size());
  const std::string text = R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})";
  for (int64_t h : sizes) {
    Config c = parse_config_text(text, "ds.json");
    const std::vector<std::string> filled = fill_hidden_size_auto(c, h);
    EXPECT_EQ(filled.size(), 3u);
    auto& want = reference.at(h);
    EXPECT_EQ(c.zero.reduce_bucket_size, want.at("zero_optimization.reduce_bucket_size")) << h;
    EXPECT_EQ(c.zero.stage3_prefetch_bucket_size,
              want.at("zero_optimization.stage3_prefetch_bucket_size")) << h;
    EXPECT_EQ(c.zero.stage3_param_persistence_threshold,
              want.at("zero_optimization.stage3_param_persistence_threshold")) << h;
    for (const auto& key : hidden_size_auto_keys()) EXPECT_EQ(c.auto_keys.count(key), 0u);
  }
}

TEST(TrainingKeys, OnlyAutoSizesAreFilledFromTheHiddenSize) {
  Config c = parse_config_text(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 5,
      "stage3_prefetch_bucket_size": "auto"}})", "ds.json");
  const std::vector<std::string> filled = fill_hidden_size_auto(c, 100);
  ASSERT_EQ(filled, std::vector<std::string>{"zero_optimization.stage3_prefetch_bucket_size"});
  EXPECT_EQ(c.zero.reduce_bucket_size, 5);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, ZeroConfig{}.stage3_param_persistence_threshold);
  EXPECT_THROW(hidden_size_auto_sizes(0), UsageError);
}

}  // namespace
}  // namespace tandem
