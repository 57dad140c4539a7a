// tandem's own YAML: Config's fields as keys, with DeepSpeed's names for the
// blocks DeepSpeed also has (zero_optimization, optimizer, scheduler). See
// docs/config.md for a sample; to_tandem_yaml() writes the same schema.

#include <cctype>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

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

void read_powersgd(const Value& block, PowerSGDConfig& p) {
  for_each_key(block, ddp_powersgd_keys(), [&](const std::string& key, const Value& v) {
    if (key == "matrix_approximation_rank") p.matrix_approximation_rank = v.as_count();
    if (key == "start_powerSGD_iter") p.start_powerSGD_iter = v.as_int(0);
    if (key == "min_compression_rate") p.min_compression_rate = v.as_number(0);
    if (key == "use_error_feedback") p.use_error_feedback = v.as_bool();
    if (key == "warm_start") p.warm_start = v.as_bool();
    if (key == "orthogonalization_epsilon") p.orthogonalization_epsilon = v.as_number(0);
    if (key == "random_seed") {
      p.random_seed = static_cast<uint32_t>(v.as_int(0, std::numeric_limits<uint32_t>::max()));
    }
  });
  // PyTorch's rule (PowerSGDOptions::start_powerSGD_iter says why).
  const Value start = block.child("start_powerSGD_iter");
  if (!start.is_null() && p.start_powerSGD_iter < 2 && (p.use_error_feedback || p.warm_start)) {
    start.fail(fmt::format("{} is below 2, the least PowerSGD allows with {}",
                           p.start_powerSGD_iter,
                           p.use_error_feedback ? "use_error_feedback" : "warm_start"),
               "set it to 2 or more (DDP rebuilds its buckets after the first backward), or set "
               "both use_error_feedback and warm_start to false");
  }
}

void read_ddp(const Value& block, Config& config) {
  DdpConfig& ddp = config.ddp;
  for_each_key(block, ddp_keys(), [&](const std::string& key, const Value& v) {
    if (key == "bucket_cap_mb") ddp.bucket_cap_mb = v.as_positive_number();
    if (key == "first_bucket_cap_mb") ddp.first_bucket_cap_mb = v.as_positive_number();
    if (key == "find_unused_parameters") ddp.find_unused_parameters = v.as_bool();
    if (key == "broadcast_buffers") ddp.broadcast_buffers = v.as_bool();
    if (key == "comm_hook") ddp.comm_hook = v.as_choice({"none", "fp16", "bf16", "powersgd"});
    if (key == "cache_cpu_allocations") ddp.cache_cpu_allocations = v.as_bool();
    if (key == "static_graph") ddp.static_graph = v.as_bool();
    if (key == "powersgd") read_powersgd(v, ddp.powersgd);
  });
  // A block that sets something, for a hook that is not PowerSGD.
  const Value powersgd = block.child("powersgd");
  if (powersgd.is_map() && powersgd.node().size() > 0 && ddp.comm_hook != "powersgd") {
    config.warnings.push_back(fmt::format(
        "{}: 'ddp.powersgd' has no effect: ddp.comm_hook is '{}'; set comm_hook: powersgd to "
        "compress with PowerSGD",
        powersgd.where(), ddp.comm_hook));
  }
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
       "optimizer", "scheduler", "ddp", "activation_checkpointing", "enable_cpu_affinity",
       "debug", "wall_clock_breakdown", "steps_per_print", "cuda_graph", "preemption",
       "tensorboard", "csv_monitor"},
      {{"same_network", "changes nothing in tandem launch: every machine must reach "
                        "main_process_ip:main_process_port; ignored",
        // Both values are quiet: false is Accelerate's default (ClusterConfig,
        // `accelerate config default`) and true what its questionnaire
        // writes; either way tandem's nodes meet at one address.
        {"true", "false"}, check_bool}},
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
                               "broadcast_buffers", "comm_hook", "cache_cpu_allocations",
                               "static_graph", "powersgd"},
                              {},
                              {}};
  return table;
}

const KeyTable& cuda_graph_keys() {
  static const KeyTable table{{"enabled", "warmup_steps", "max_captures"}, {}, {}};
  return table;
}

const KeyTable& preemption_keys() {
  static const KeyTable table{{"enabled", "signals", "checkpoint_dir", "save", "requeue"}, {}, {}};
  return table;
}

const KeyTable& ddp_powersgd_keys() {
  static const KeyTable table{{"matrix_approximation_rank", "start_powerSGD_iter",
                               "min_compression_rate", "use_error_feedback", "warm_start",
                               "orthogonalization_epsilon", "random_seed"},
                              {},
                              {}};
  return table;
}

namespace {

// cuda_graph: {enabled, warmup_steps, max_captures} (Accelerator::train_step).
void read_cuda_graph(const Value& block, CudaGraphConfig& graph) {
  expect_map(block, "give a block, e.g. cuda_graph: {enabled: true}, or remove the key");
  if (block.is_null()) return;
  for_each_key(block, cuda_graph_keys(), [&](const std::string& key, const Value& v) {
    if (key == "enabled") {
      graph.enabled = v.as_bool();
    } else if (key == "warmup_steps") {
      graph.warmup_steps = v.as_count();
    } else if (key == "max_captures") {
      graph.max_captures = v.as_count();
    }
  });
}

// preemption: {enabled, signals, checkpoint_dir, save, requeue}.
void read_preemption(const Value& block, PreemptionConfig& preemption) {
  expect_map(block, "give a block, e.g. preemption: {enabled: true, checkpoint_dir: ckpt}, or "
                    "remove the key");
  if (block.is_null()) return;
  for_each_key(block, preemption_keys(), [&](const std::string& key, const Value& v) {
    if (key == "enabled") {
      preemption.enabled = v.as_bool();
    } else if (key == "signals") {
      preemption.signals.clear();
      for (const Value& item : v.elements()) {
        std::string name = item.as_string();
        for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        if (name.rfind("SIG", 0) == 0) name = name.substr(3);
        if (name != "USR1" && name != "USR2" && name != "TERM" && name != "INT" && name != "HUP") {
          item.fail("'" + item.as_string() + "' is not a signal preemption can handle",
                    "use USR1, USR2, TERM, INT or HUP");
        }
        preemption.signals.push_back(name);
      }
      if (preemption.signals.empty()) {
        v.fail("the list is empty", "name at least one signal, e.g. [USR1, TERM]");
      }
    } else if (key == "checkpoint_dir") {
      preemption.checkpoint_dir = v.is_null() ? "" : v.as_string();
    } else if (key == "save") {
      preemption.save = v.as_bool();
    } else if (key == "requeue") {
      const std::string text = v.as_string();
      preemption.requeue = text == "auto" || text == "AUTO" ? "auto" : v.as_bool() ? "true" : "false";
    }
  });
}

}  // namespace

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
      read_ddp(v, config);
    } else if (key == "activation_checkpointing") {
      read_activation_checkpointing(v, config, Dialect::kTandem);
    } else if (key == "cuda_graph") {
      read_cuda_graph(v, config.cuda_graph);
    } else if (key == "preemption") {
      read_preemption(v, config.preemption);
    } else if (key == "tensorboard" || key == "csv_monitor") {
      read_monitor(v, key == "tensorboard" ? config.tensorboard : config.csv_monitor);
    } else if (key == "enable_cpu_affinity") {
      config.enable_cpu_affinity = v.as_bool();
    } else if (key == "debug") {
      config.debug = v.as_bool();
    }
  }, precision_hint);
  check_launch_settings(config);
}

}  // namespace tandem::config_detail
