#include "config/key_index.h"

#include "config/readers.h"

namespace tandem::config_detail {

std::vector<KeyLevel> key_levels() {
  std::vector<KeyLevel> levels;
  auto add = [&](ConfigFormat format, const std::string& path, const KeyTable& keys,
                 const std::string& type = "") {
    levels.push_back({format, path, &keys, type});
  };
  // The blocks tandem YAML takes from DeepSpeed, read in each one's dialect.
  auto add_shared_blocks = [&](ConfigFormat format, Dialect dialect) {
    add(format, "zero_optimization", zero_optimization_keys(dialect));
    add(format, "zero_optimization.offload_optimizer", offload_keys(true));
    add(format, "zero_optimization.offload_param", offload_keys(false));
    add(format, "optimizer", optimizer_keys());
    for (const auto& type : optimizer_types()) {
      add(format, "optimizer.params", optimizer_params_keys(type), type);
    }
    add(format, "scheduler", scheduler_keys());
    for (const auto& type : scheduler_types()) {
      add(format, "scheduler.params", scheduler_params_keys(type), type);
    }
    add(format, "activation_checkpointing", activation_checkpointing_keys(dialect));
  };

  add(ConfigFormat::kDeepSpeedJson, "", deepspeed_top_level_keys());
  add(ConfigFormat::kDeepSpeedJson, "fp16", deepspeed_fp16_keys());
  add(ConfigFormat::kDeepSpeedJson, "bf16", deepspeed_bf16_keys());
  add(ConfigFormat::kDeepSpeedJson, "bfloat16", deepspeed_bf16_keys());
  add(ConfigFormat::kDeepSpeedJson, "torch_autocast", deepspeed_torch_autocast_keys());
  add(ConfigFormat::kDeepSpeedJson, "tensorboard", deepspeed_monitor_keys());
  add(ConfigFormat::kDeepSpeedJson, "csv_monitor", deepspeed_monitor_keys());
  add_shared_blocks(ConfigFormat::kDeepSpeedJson, Dialect::kDeepSpeed);

  add(ConfigFormat::kTandemYaml, "", tandem_top_level_keys());
  add(ConfigFormat::kTandemYaml, "fp16", tandem_fp16_keys());
  add(ConfigFormat::kTandemYaml, "ddp", ddp_keys());
  add(ConfigFormat::kTandemYaml, "ddp.powersgd", ddp_powersgd_keys());
  add(ConfigFormat::kTandemYaml, "cuda_graph", cuda_graph_keys());
  add(ConfigFormat::kTandemYaml, "tensorboard", deepspeed_monitor_keys());
  add(ConfigFormat::kTandemYaml, "csv_monitor", deepspeed_monitor_keys());
  add(ConfigFormat::kTandemYaml, "preemption", preemption_keys());
  add_shared_blocks(ConfigFormat::kTandemYaml, Dialect::kTandem);

  // A deepspeed_config_file is a DeepSpeed JSON, read as above.
  add(ConfigFormat::kAccelerateYaml, "", accelerate_top_level_keys());
  add(ConfigFormat::kAccelerateYaml, "deepspeed_config", accelerate_deepspeed_section_keys());
  add(ConfigFormat::kAccelerateYaml, "fsdp_config", accelerate_fsdp_keys());
  return levels;
}

}  // namespace tandem::config_detail
