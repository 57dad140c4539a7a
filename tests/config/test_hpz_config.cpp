// zero_optimization.zero_hpz_partition_size (HSDP): read from DeepSpeed JSON
// and tandem YAML, checked against the world size when the run starts, and
// a warning where it does nothing (stages 0, 1) or differs from DeepSpeed
// (stage 2).

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_testing.h"

namespace tandem {
namespace hpz_config_test {

using testing::contains;
using testing::parse_error;
using testing::usage_error;

Config deepspeed(int stage, const std::string& hpz) {
  return parse_config_text(
      "{\n  \"zero_optimization\": {\n    \"stage\": " + std::to_string(stage) +
          ",\n    \"zero_hpz_partition_size\": " + hpz + "\n  }\n}\n",
      "ds.json", ".");
}

TEST(HpzConfig, DeepSpeedJsonAtStage3ShardsInsideGroupsWithoutAWarning) {
  const Config file = deepspeed(3, "2");
  EXPECT_EQ(file.zero.hpz_partition_size, 2);
  const Config resolved = resolve_config(file, {}, {}, 4);
  EXPECT_TRUE(resolved.warnings.empty()) << resolved.warnings.front();
  const auto json = nlohmann::json::parse(resolved_config_json(resolved, 4));
  EXPECT_EQ(json["zero_optimization"]["zero_hpz_partition_size"], 2);
  // The default is off.
  EXPECT_EQ(Config{}.zero.hpz_partition_size, 1);
}

TEST(HpzConfig, TandemYamlReadsTheSameKey) {
  const Config file = parse_config_text(
      "distributed: DEEPSPEED\nzero_optimization:\n  stage: 3\n  zero_hpz_partition_size: 8\n",
      "tandem.yaml", ".");
  EXPECT_EQ(file.zero.hpz_partition_size, 8);
}

TEST(HpzConfig, ASizeThatDoesNotDivideTheWorldIsAnErrorNamingTheFilePosition) {
  const std::string message = usage_error([] { resolve_config(deepspeed(3, "2"), {}, {}, 3); });
  EXPECT_TRUE(contains(message, "ds.json:4:32: zero_optimization.zero_hpz_partition_size is 2, "
                                "which does not divide the world size 3"))
      << message;
  EXPECT_TRUE(contains(message, "Set it to a divisor of 3")) << message;
}

TEST(HpzConfig, ZeroAndFractionsAreRefusedWhenRead) {
  EXPECT_TRUE(contains(parse_error("{\"zero_optimization\": {\"zero_hpz_partition_size\": 0}}",
                                   "ds.json"),
                       "1 turns HSDP off"));
  EXPECT_FALSE(parse_error("{\"zero_optimization\": {\"zero_hpz_partition_size\": 1.5}}",
                           "ds.json")
                   .empty());
}

TEST(HpzConfig, Stage2WarnsThatItShardsLikeHybridShardZero2) {
  const Config resolved = resolve_config(deepspeed(2, "2"), {}, {}, 4);
  ASSERT_EQ(resolved.warnings.size(), 1u);
  EXPECT_TRUE(contains(resolved.warnings[0], "FSDP's HYBRID_SHARD_ZERO2")) << resolved.warnings[0];
  EXPECT_EQ(resolved.zero.hpz_partition_size, 2);
}

TEST(HpzConfig, Stages0And1WarnThatItHasNoEffect) {
  for (int stage : {0, 1}) {
    // Not even checked against the world: nothing is sharded by it.
    const Config resolved = resolve_config(deepspeed(stage, "4"), {}, {}, 2);
    ASSERT_EQ(resolved.warnings.size(), 1u);
    EXPECT_TRUE(contains(resolved.warnings[0],
                         "applies to ZeRO stages 2 and 3 only; it has no effect at stage " +
                             std::to_string(stage)))
        << resolved.warnings[0];
  }
}

}  // namespace hpz_config_test
}  // namespace tandem
