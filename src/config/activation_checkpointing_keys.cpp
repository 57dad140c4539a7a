// DeepSpeed's activation_checkpointing block, in DeepSpeed JSON and tandem
// YAML. DeepSpeed applies it to the blocks a model checkpoints through
// deepspeed.checkpointing; tandem applies it to the blocks a program marks
// with tandem::Checkpointed. What DeepSpeed does beyond recomputing (split
// activations across model-parallel ranks, keep them in CPU memory, ...) is
// not implemented: set to true, those keys warn (their KeyNote).

#include "config/readers.h"

namespace tandem::config_detail {
namespace {

// Why each DeepSpeed option set to true changes nothing in tandem.
std::vector<KeyNote> checkpointing_notes() {
  auto note = [](const std::string& because) {
    return "is accepted but has no effect: " + because + "; set it to false to silence this";
  };
  return {
      {"partition_activations",
       note("DeepSpeed splits the saved block inputs across the model-parallel group, and "
            "tandem has no model parallelism: each rank keeps its own"),
       {"false"}, check_bool},
      {"cpu_checkpointing",
       note("the saved block inputs stay on the model's device (offloading them to CPU memory "
            "is not implemented)"),
       {"false"}, check_bool},
      {"contiguous_memory_optimization",
       note("DeepSpeed uses it only to pack partitioned activations, which tandem does not "
            "partition"),
       {"false"}, check_bool},
      {"synchronize_checkpoint_boundary",
       note("tandem does not synchronise the device at checkpoint boundaries"), {"false"},
       check_bool},
      {"profile", note("tandem does not profile the checkpointed forward passes"), {"false"},
       check_bool},
      {"number_checkpoints",
       "is accepted but has no effect: it sizes DeepSpeed's contiguous activation buffer, which "
       "tandem does not have; remove it to silence this",
       {"null"}, check_whole(1)},
  };
}

}  // namespace

const KeyTable& activation_checkpointing_keys(Dialect dialect) {
  static const KeyTable deepspeed_table{{}, checkpointing_notes(), {}};
  static const KeyTable tandem_table{{"enabled"}, checkpointing_notes(), {}};
  return dialect == Dialect::kTandem ? tandem_table : deepspeed_table;
}

void read_activation_checkpointing(const Value& block, Config& config, Dialect dialect) {
  expect_map(block, "give a block, e.g. \"activation_checkpointing\": {} to checkpoint the "
                    "blocks the program marks, or remove the key");
  // null is JSON's "none": no checkpointing, as an absent block.
  if (block.is_null()) return;
  config.activation_checkpointing.enabled = true;
  for_each_key(block, activation_checkpointing_keys(dialect),
               [&](const std::string& key, const Value& v) {
    if (key == "enabled") config.activation_checkpointing.enabled = v.as_bool();
  });
}

}  // namespace tandem::config_detail
