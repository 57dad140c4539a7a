// DeepSpeed's activation_checkpointing block, in DeepSpeed JSON and tandem
// YAML. DeepSpeed applies it to the blocks a model checkpoints through
// deepspeed.checkpointing; tandem applies it to the blocks a program marks
// with tandem::Checkpointed. What DeepSpeed does beyond recomputing (split
// activations across model-parallel ranks, keep them in CPU memory, ...) is
// not implemented: set to true, those keys warn.

#include "config/readers.h"

namespace tandem::config_detail {
namespace {

// Why each DeepSpeed option set to true changes nothing in tandem.
std::string ignored_because(const std::string& key) {
  if (key == "partition_activations") {
    return "DeepSpeed splits the saved block inputs across the model-parallel group, and "
           "tandem has no model parallelism: each rank keeps its own";
  }
  if (key == "cpu_checkpointing") {
    return "the saved block inputs stay on the model's device (offloading them to CPU memory "
           "is not implemented)";
  }
  if (key == "contiguous_memory_optimization") {
    return "DeepSpeed uses it only to pack partitioned activations, which tandem does not "
           "partition";
  }
  if (key == "synchronize_checkpoint_boundary") {
    return "tandem does not synchronise the device at checkpoint boundaries";
  }
  return "tandem does not profile the checkpointed forward passes";  // profile
}

}  // namespace

const KeyTable& activation_checkpointing_keys(Dialect dialect) {
  static const std::vector<std::string> deepspeed_keys = {
      "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
      "number_checkpoints", "synchronize_checkpoint_boundary", "profile"};
  static const KeyTable deepspeed_table{deepspeed_keys, {}, {}, {}};
  static const KeyTable tandem_table = [] {
    KeyTable table{deepspeed_keys, {}, {}, {}};
    table.read.insert(table.read.begin(), "enabled");
    return table;
  }();
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
    if (key == "enabled") {
      config.activation_checkpointing.enabled = v.as_bool();
    } else if (key == "number_checkpoints") {
      // Sizes DeepSpeed's contiguous buffer only; checked, then unused.
      if (!v.is_null()) v.as_count();
    } else if (v.as_bool()) {
      config.warnings.push_back(v.where() + ": '" + v.path() + "' is accepted but has no effect: " +
                                ignored_because(key) + "; set it to false to silence this");
    }
  });
}

}  // namespace tandem::config_detail
