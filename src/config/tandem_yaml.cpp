// tandem's own YAML: Config's fields as keys, with DeepSpeed's names for the
// blocks DeepSpeed also has (zero_optimization, optimizer, scheduler). See
// docs/config.md for a sample; to_tandem_yaml() writes the same schema.

#include "config/readers.h"

namespace tandem::config_detail {
namespace {

std::string precision_hint(const std::string& key) {
  if (key == "enabled" || key == "bf16" || key == "bfloat16") {
    return " (tandem YAML turns half precision on with the top-level key mixed_precision: "
           "bf16 or fp16)";
  }
  return "";
}

void read_loss_scale(const Value& block, LossScaleConfig& scale) {
  for_each_key(block, tandem_fp16_keys(), [&](const std::string& key, const Value& v) {
    if (key == "deepspeed_semantics") {
      scale.deepspeed_semantics = v.as_bool();
    } else {
      read_loss_scale_key(key, v, scale);
    }
  }, precision_hint);
}

void read_ddp(const Value& block, DdpConfig& ddp) {
  for_each_key(block, ddp_keys(), [&](const std::string& key, const Value& v) {
    if (key == "bucket_cap_mb") ddp.bucket_cap_mb = v.as_positive_number();
    if (key == "first_bucket_cap_mb") ddp.first_bucket_cap_mb = v.as_positive_number();
    if (key == "find_unused_parameters") ddp.find_unused_parameters = v.as_bool();
    if (key == "broadcast_buffers") ddp.broadcast_buffers = v.as_bool();
    if (key == "comm_hook") ddp.comm_hook = v.as_choice({"none", "fp16", "bf16"});
    if (key == "cache_cpu_allocations") ddp.cache_cpu_allocations = v.as_bool();
  });
}

std::optional<int64_t> count_or_auto(const Value& v) {
  if (v.is_null() || v.is_auto()) return std::nullopt;
  return v.as_count();
}

}  // namespace

const KeyTable& tandem_top_level_keys() {
  static const KeyTable table{
      {"distributed", "num_processes", "num_machines", "machine_rank", "main_process_ip",
       "main_process_port", "gpu_ids", "use_cpu", "rdzv_backend",
       "mixed_precision", "train_batch_size", "train_micro_batch_size_per_gpu",
       "gradient_accumulation_steps", "gradient_clipping", "seed", "fp16", "zero_optimization",
       "optimizer", "scheduler", "ddp", "activation_checkpointing"},
      {{"steps_per_print", "is not implemented yet: tandem prints no periodic step report; "
                           "ignored", {"10"}, check_whole(1)},
       {"wall_clock_breakdown", "is not implemented yet: tandem logs no per-step time "
                                "breakdown; ignored", {"false"}, check_bool},
       {"same_network", "changes nothing in tandem launch: every machine must reach "
                        "main_process_ip:main_process_port; ignored", {"true"}, check_bool}},
      {}};
  return table;
}

const KeyTable& tandem_fp16_keys() {
  static const KeyTable table{{"loss_scale", "initial_scale_power", "loss_scale_window",
                               "hysteresis", "consecutive_hysteresis", "min_loss_scale",
                               "deepspeed_semantics"},
                              {},
                              {}};
  return table;
}

const KeyTable& ddp_keys() {
  static const KeyTable table{{"bucket_cap_mb", "first_bucket_cap_mb", "find_unused_parameters",
                               "broadcast_buffers", "comm_hook", "cache_cpu_allocations"},
                              {},
                              {}};
  return table;
}

void read_tandem_document(const Value& root, Config& config) {
  for_each_key(root, tandem_top_level_keys(), [&](const std::string& key, const Value& v) {
    if (read_launch_key(key, v, config) || read_shared_training_key(key, v, config)) return;
    if (key == "distributed") {
      config.distributed_type = read_distributed_type(v);
    } else if (key == "train_batch_size") {
      config.train_batch_size = count_or_auto(v);
    } else if (key == "train_micro_batch_size_per_gpu") {
      config.train_micro_batch_size_per_gpu = count_or_auto(v);
    } else if (key == "gradient_accumulation_steps") {
      config.gradient_accumulation_steps = count_or_auto(v);
    } else if (key == "seed") {
      config.seed = v.is_null() ? std::nullopt : std::optional<uint64_t>(v.as_unsigned());
    } else if (key == "fp16") {
      read_loss_scale(v, config.fp16);
    } else if (key == "zero_optimization") {
      read_zero_optimization(v, config, Dialect::kTandem);
    } else if (key == "optimizer") {
      read_optimizer(v, config, Dialect::kTandem);
    } else if (key == "scheduler") {
      read_scheduler(v, config);
    } else if (key == "ddp") {
      read_ddp(v, config.ddp);
    } else if (key == "activation_checkpointing") {
      read_activation_checkpointing(v, config, Dialect::kTandem);
    }
  }, precision_hint);
  check_launch_settings(config);
}

}  // namespace tandem::config_detail
