// DeepSpeed's step report keys (issue 33, item 2): wall_clock_breakdown and
// steps_per_print reach the Config from every dialect, round-trip through
// tandem YAML, and a code override beats the file. What they do in training
// is tested in tests/accelerate/test_wall_clock.cpp.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::contains;
using testing::parse_error;
using testing::usage_error;

TEST(StepReportKeys, NotGivenMeansNoBreakdownAndNoProgressLine) {
  for (const char* text : {"{}", "seed: 1\n"}) {
    const Config c = parse_config_text(text, text[0] == '{' ? "ds.json" : "t.yaml");
    EXPECT_FALSE(c.wall_clock_breakdown);
    EXPECT_FALSE(c.steps_per_print.has_value());
  }
  // null is DeepSpeed's own default for steps_per_print: not given.
  const Config null = parse_config_text(R"({"steps_per_print": null})", "ds.json");
  EXPECT_FALSE(null.steps_per_print.has_value());
  EXPECT_TRUE(null.warnings.empty());
}

TEST(StepReportKeys, DeepSpeedJsonSetsBothWithoutWarnings) {
  const Config c =
      parse_config_text(R"({"wall_clock_breakdown": true, "steps_per_print": 3})", "ds.json");
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(3));
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_TRUE(contains(c.key_locations.at("steps_per_print"), "ds.json:1:"));
}

TEST(StepReportKeys, TandemYamlSetsBothAndWritesThemBack) {
  const Config c = parse_config_text("wall_clock_breakdown: true\nsteps_per_print: 7\n", "t.yaml");
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(7));
  EXPECT_TRUE(c.warnings.empty());
  const std::string yaml = to_tandem_yaml(c);
  EXPECT_TRUE(contains(yaml, "wall_clock_breakdown: true\n"));
  EXPECT_TRUE(contains(yaml, "steps_per_print: 7\n"));
  const Config again = parse_config_text(yaml, "again.yaml");
  EXPECT_TRUE(same_settings(c, again)) << yaml;
  // Not given is written as null and read back as not given.
  const Config plain = parse_config_text(to_tandem_yaml(Config{}), "defaults.yaml");
  EXPECT_FALSE(plain.steps_per_print.has_value());
  EXPECT_FALSE(plain.wall_clock_breakdown);
  // same_settings() sees each of them.
  Config other = c;
  other.steps_per_print = 8;
  EXPECT_FALSE(same_settings(c, other));
  other = c;
  other.wall_clock_breakdown = false;
  EXPECT_FALSE(same_settings(c, other));
}

TEST(StepReportKeys, AnAccelerateDeepSpeedConfigFileCarriesThem) {
  testing::TempFolder dir;
  dir.write("ds.json", R"({"zero_optimization": {"stage": 1}, "wall_clock_breakdown": true,
                          "steps_per_print": 4})");
  const Config c = parse_config_text(
      "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n",
      "a.yaml", dir.path());
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.steps_per_print, std::optional<int64_t>(4));
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  // Accelerate's own top level has no such key: tandem's hint says where it goes.
  EXPECT_TRUE(contains(parse_error("distributed_type: DEEPSPEED\nsteps_per_print: 4\n", "a.yaml"),
                       "Accelerate keeps DeepSpeed settings under deepspeed_config"));
}

TEST(StepReportKeys, BadValuesAreRefusedNamingTheKey) {
  EXPECT_TRUE(contains(parse_error(R"({"steps_per_print": 0})", "ds.json"),
                       "steps_per_print: expected a positive integer, got 0"));
  EXPECT_TRUE(contains(parse_error("steps_per_print: -2\n", "t.yaml"), "steps_per_print"));
  EXPECT_TRUE(contains(parse_error(R"({"steps_per_print": 2.5})", "ds.json"), "steps_per_print"));
  EXPECT_TRUE(contains(parse_error("wall_clock_breakdown: 3\n", "t.yaml"), "wall_clock_breakdown"));
}

TEST(StepReportKeys, CodeOverridesBeatTheFileAndPrintInTheResolvedJson) {
  const Config file =
      parse_config_text(R"({"wall_clock_breakdown": true, "steps_per_print": 3})", "ds.json");
  ConfigOverrides overrides;
  overrides.wall_clock_breakdown = false;
  overrides.steps_per_print = 5;
  const Config r = resolve_config(file, {}, overrides, 2);
  EXPECT_FALSE(r.wall_clock_breakdown);
  EXPECT_EQ(r.steps_per_print, std::optional<int64_t>(5));
  const Config kept = resolve_config(file, {}, {}, 2);
  EXPECT_TRUE(kept.wall_clock_breakdown);
  EXPECT_EQ(kept.steps_per_print, std::optional<int64_t>(3));
  const nlohmann::json j = nlohmann::json::parse(resolved_config_json(kept, 2));
  EXPECT_EQ(j["wall_clock_breakdown"], true);
  EXPECT_EQ(j["steps_per_print"], 3);
  EXPECT_TRUE(nlohmann::json::parse(resolved_config_json(Config{}, 1))["steps_per_print"].is_null());
  overrides.steps_per_print = 0;
  EXPECT_TRUE(contains(usage_error([&] { resolve_config(file, {}, overrides, 2); }),
                       "steps_per_print override is 0"));
}

}  // namespace
}  // namespace tandem
