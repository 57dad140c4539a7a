// DeepSpeed's activation_checkpointing block: present turns checkpointing on
// for the blocks a program marks; the sub-keys tandem does not implement
// warn when they ask for something, naming the key; unknown keys are errors.
// tandem YAML has the same block with `enabled`.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config_testing.h"

namespace tandem {
namespace {

using testing::contains;
using testing::parse_error;

Config from_json(const std::string& text) { return parse_config_text(text, "ds.json"); }

TEST(ActivationCheckpointingConfig, AbsentOrNullIsOffAndAnyBlockIsOn) {
  EXPECT_FALSE(from_json(R"({"train_batch_size": 8})").activation_checkpointing.enabled);
  EXPECT_FALSE(from_json(R"({"activation_checkpointing": null})").activation_checkpointing.enabled);
  Config c = from_json(R"({"activation_checkpointing": {}})");
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  EXPECT_TRUE(c.warnings.empty());
  c = from_json(R"({"activation_checkpointing": {"partition_activations": false,
                   "cpu_checkpointing": false, "contiguous_memory_optimization": false,
                   "number_checkpoints": null, "synchronize_checkpoint_boundary": false,
                   "profile": false}})");
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

TEST(ActivationCheckpointingConfig, OptionsTandemDoesNotImplementWarnNamingTheKey) {
  Config c = from_json(
      "{\"activation_checkpointing\": {\"partition_activations\": true,\n"
      " \"cpu_checkpointing\": true, \"contiguous_memory_optimization\": true,\n"
      " \"synchronize_checkpoint_boundary\": true, \"profile\": true}}");
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  ASSERT_EQ(c.warnings.size(), 5u);
  EXPECT_TRUE(contains(c.warnings[0], "ds.json:1:"));
  EXPECT_TRUE(contains(c.warnings[0], "'activation_checkpointing.partition_activations'"));
  EXPECT_TRUE(contains(c.warnings[0], "no model parallelism"));
  EXPECT_TRUE(contains(c.warnings[1], "ds.json:2:"));
  EXPECT_TRUE(contains(c.warnings[1], "'activation_checkpointing.cpu_checkpointing'"));
  EXPECT_TRUE(contains(c.warnings[4], "'activation_checkpointing.profile'"));
  for (const auto& w : c.warnings) EXPECT_TRUE(contains(w, "has no effect")) << w;
}

TEST(ActivationCheckpointingConfig, BadValuesAndUnknownKeysAreErrors) {
  std::string e = parse_error(R"({"activation_checkpointing": {"partition_activation": true}})",
                              "ds.json");
  EXPECT_TRUE(contains(e, "activation_checkpointing.partition_activation")) << e;
  EXPECT_TRUE(contains(e, "partition_activations")) << e;  // did you mean
  e = parse_error(R"({"activation_checkpointing": true})", "ds.json");
  EXPECT_TRUE(contains(e, "activation_checkpointing")) << e;
  e = parse_error(R"({"activation_checkpointing": {"number_checkpoints": 0}})", "ds.json");
  EXPECT_TRUE(contains(e, "number_checkpoints")) << e;
  e = parse_error(R"({"activation_checkpointing": {"profile": "yes please"}})", "ds.json");
  EXPECT_TRUE(contains(e, "profile")) << e;
  // `enabled` is tandem YAML's; DeepSpeed's block has none.
  e = parse_error(R"({"activation_checkpointing": {"enabled": true}})", "ds.json");
  EXPECT_TRUE(contains(e, "enabled")) << e;
}

TEST(ActivationCheckpointingConfig, TandemYamlTakesEnabledAndRoundTrips) {
  Config on = parse_config_text("activation_checkpointing:\n  enabled: true\n", "t.yaml");
  EXPECT_TRUE(on.activation_checkpointing.enabled);
  Config off = parse_config_text("activation_checkpointing:\n  enabled: false\n", "t.yaml");
  EXPECT_FALSE(off.activation_checkpointing.enabled);
  Config back = parse_config_text(to_tandem_yaml(on), "written.yaml");
  EXPECT_TRUE(back.activation_checkpointing.enabled);
  EXPECT_TRUE(same_settings(back, on));
  Config changed = on;
  changed.activation_checkpointing.enabled = false;
  EXPECT_FALSE(same_settings(changed, on));
}

TEST(ActivationCheckpointingConfig, TheResolvedConfigShowsIt) {
  Config c = resolve_config(from_json(R"({"activation_checkpointing": {}})"), {}, {}, 2);
  EXPECT_TRUE(c.activation_checkpointing.enabled);
  auto j = nlohmann::json::parse(resolved_config_json(c, 2));
  EXPECT_EQ(j["activation_checkpointing"]["enabled"], true);
}

}  // namespace
}  // namespace tandem
