// DeepSpeed's JSON config: its top level, the batch triple and the fp16 /
// bf16 blocks. zero_optimization, optimizer and scheduler have their own
// files because tandem YAML shares them.

#include <map>
#include <optional>

#include "config/readers.h"

namespace tandem::config_detail {
namespace {

// Keys DeepSpeed reads that tandem does not act on. Accepted with a
// warning that says what tandem does instead, so that real configs load.
std::vector<KeyNote> warned_top_level_keys() {
  std::vector<KeyNote> keys = notes_for(
      {"comet", "wandb", "comms_logger", "flops_profiler", "memory_breakdown", "timers",
       "dump_state"},
      "is DeepSpeed's own logging or profiling: tandem logs through the Accelerator's trackers "
      "(TensorBoard, CSV, JSON lines) and profiles with Accelerator::profile; ignored");
  auto add = [&](std::vector<std::string> names, const std::string& note,
                 std::vector<std::string> quiet = {},
                 std::function<void(const Value&)> check = nullptr) {
    for (auto& n : notes_for(names, note, quiet, check)) keys.push_back(std::move(n));
  };
  add({"aio"}, "configures DeepSpeed's NVMe offload I/O: tandem offloads to CPU memory only; "
               "ignored");
  add({"autotuning"}, "is DeepSpeed's autotuner, which tandem does not have: the file's "
                      "settings are used as written; ignored");
  add({"checkpoint"}, "configures DeepSpeed's checkpoint engine: tandem writes its own "
                      "checkpoints (docs/checkpoints.md; for use_node_local_storage set "
                      "AcceleratorOptions::save_on_each_node); ignored");
  add({"communication_data_type", "seq_parallel_communication_data_type"},
      "is not implemented: tandem reduces gradients in their own dtype, or as the DDP "
      "comm_hook says; ignored");
  add({"compile"}, "asks for torch.compile, which LibTorch does not have; ignored");
  add({"data_efficiency", "data_types"},
      "configures DeepSpeed's data pipeline: the program's own data loader decides; ignored");
  add({"dataloader_drop_last"}, "is not implemented: tandem's prepared loader keeps its own "
                                "drop_last setting; ignored", {"false"}, check_bool);
  add({"disable_allgather"}, "is not implemented: tandem all-gathers ZeRO parameters as it "
                             "needs them; ignored", {"false"});
  add({"gradient_predivide_factor", "prescale_gradients"},
      "is not implemented: tandem sums gradients, then divides by the world size once; "
      "ignored", {"1", "1.0", "false"});
  add({"hybrid_engine"}, "is DeepSpeed's RLHF engine, which tandem does not have; ignored");
  add({"pipeline"}, "configures pipeline parallelism, which tandem does not do; ignored");
  add({"weight_quantization"}, "is not implemented: tandem trains unquantized weights; ignored");
  add({"datastates_ckpt"}, "configures DeepSpeed's DataStates checkpoint engine: tandem writes "
                          "its own checkpoints (docs/checkpoints.md); ignored");
  add({"disable_python_gc"}, "tunes Python's garbage collector, which a C++ program does not "
                             "have; ignored", {"false", "true"});
  add({"expert_parallel", "use_data_before_expert_parallelism"},
      "configures mixture-of-experts parallelism, which tandem does not do; ignored",
      {"false"});
  add({"gradient_allreduce_op"}, "is mean in tandem, which averages gradients over the ranks",
      {"mean", "MEAN"}, [](const Value& v) {
        const std::string op = v.as_string();
        if (op != "mean" && op != "MEAN") {
          v.fail("'" + op + "' is not implemented: tandem averages gradients over the ranks",
                 "use mean or remove the key");
        }
      });
  add({"log_level"}, "is DeepSpeed's logging level: tandem's own logging decides; ignored");
  add({"managed_gradient_accumulation"},
      "false is not implemented: the Accelerator manages gradient accumulation; ignored",
      {"true"}, check_bool);
  add({"vocabulary_size"}, "only feeds DeepSpeed's tensor-core alignment warning; ignored");
  add({"data_parallel_size"}, "is DeepSpeed's data-parallel size next to "
                              "sequence_parallel_size: tandem's is the world size; ignored",
      {}, check_whole(1));
  add({"zero_force_ds_cpu_optimizer"},
      "is not implemented: with offload tandem always steps its own CPU Adam; ignored",
      {"true"});
  return keys;
}

// Blocks DeepSpeed has removed (deepspeedai/DeepSpeed#8489). Current
// DeepSpeed refuses a file that still has one, because a leftover block
// would be ignored silently (elasticity would even change the batch size);
// tandem refuses it too, with DeepSpeed's replacement as the fix.
const std::map<std::string, std::string>& removed_top_level_keys() {
  static const std::map<std::string, std::string> keys = {
      {"amp", "use the fp16 or bf16 block instead of Apex AMP"},
      {"compression_training", "remove the block; the model would train unquantized anyway"},
      {"curriculum_learning",
       "remove the block (DeepSpeed moved it to data_efficiency.data_sampling)"},
      {"eigenvalue", "remove the block"},
      {"elasticity",
       "remove the block and set train_batch_size, train_micro_batch_size_per_gpu and "
       "gradient_accumulation_steps directly"},
      {"graph_harvesting", "remove the key"},
      {"nebula", "remove the block; checkpoints are written by the checkpoint API"},
      {"progressive_layer_drop", "remove the block"},
      {"quantize_training", "remove the block"},
      {"sparse_attention", "remove the block"},
      {"sparse_gradients", "remove the key; gradients are reduced dense"},
  };
  return keys;
}

std::vector<KeyNote> removed_keys() {
  std::vector<KeyNote> notes;
  for (const auto& [name, fix] : removed_top_level_keys()) {
    notes.push_back({name, "DeepSpeed has removed this feature, and current DeepSpeed refuses a "
                           "config that still has the key (deepspeedai/DeepSpeed#8489); " + fix});
  }
  return notes;
}

std::optional<int64_t> read_batch_count(const Value& value) {
  if (value.is_auto() || value.is_null()) return std::nullopt;
  return value.as_count();
}

// The half-precision blocks switched on so far, to report a clash.
struct PrecisionBlocks {
  std::string fp16_on;  // "fp16.enabled" once true
  std::string bf16_on;  // "bf16.enabled" or "bfloat16.enabled" once true
  // torch_autocast.enabled once true, with the mode its dtype asks for.
  std::optional<Value> autocast_on;
  MixedPrecision autocast_mode = MixedPrecision::kNo;
  bool autocast_device_default = false;  // no dtype given
};

[[noreturn]] void fail_both_enabled(const Value& v, const std::string& other) {
  v.fail("fp16 and bf16 are both enabled (" + other + " is true too)",
         "enable only one of them: set the other block's \"enabled\" to false");
}

void read_fp16(const Value& block, Config& config, PrecisionBlocks& seen) {
  LossScaleConfig& scale = config.fp16;
  scale.deepspeed_semantics = true;
  for_each_key(block, deepspeed_fp16_keys(), [&](const std::string& key, const Value& v) {
    if (key == "enabled") {
      if (v.is_auto()) {
        v.note_auto();
      } else if (v.as_bool()) {
        if (!seen.bf16_on.empty()) fail_both_enabled(v, seen.bf16_on);
        seen.fp16_on = v.path();
        config.mixed_precision = MixedPrecision::kFp16;
        config.key_locations[kDeepSpeedPrecisionKey] = v.where() + " (" + v.path() + ")";
      }
    } else if (key == "min_loss_scale") {
      // DeepSpeed's DeepSpeedFP16Config declares it an int and refuses 0.5;
      // tandem YAML's fp16 block takes fractions.
      scale.min_loss_scale = static_cast<double>(v.as_int(
          1, std::numeric_limits<int64_t>::max(),
          "DeepSpeed reads fp16.min_loss_scale as a whole number: set it to 1 (the default) or "
          "another whole number >= 1"));
    } else {
      read_loss_scale_key(key, v, scale);
    }
  });
}

void read_bf16(const Value& block, Config& config, PrecisionBlocks& seen) {
  for_each_key(block, deepspeed_bf16_keys(), [&](const std::string&, const Value& v) {
    if (v.is_auto()) {
      v.note_auto();
      return;
    }
    if (!v.as_bool()) return;
    if (!seen.fp16_on.empty()) fail_both_enabled(v, seen.fp16_on);
    seen.bf16_on = v.path();
    config.mixed_precision = MixedPrecision::kBf16;
    config.key_locations[kDeepSpeedPrecisionKey] = v.where() + " (" + v.path() + ")";
  });
}

// DeepSpeed's torch_autocast block: fp32 parameters, the forward pass under
// torch.autocast in `dtype`, which is tandem's mixed_precision. Without a
// dtype torch.autocast takes its device's default: bf16 here (the CPU's),
// and Config::autocast_device_default tells the Accelerator to take fp16 on
// a CUDA device.
MixedPrecision autocast_dtype_mode(const Value& dtype) {
  if (dtype.is_null()) return MixedPrecision::kBf16;
  // DeepSpeed's DtypeEnum spellings.
  const std::string name = dtype.as_choice({"torch.bfloat16", "bf16", "bfloat16", "torch.float16",
                                            "fp16", "float16", "half", "torch.float32", "fp32",
                                            "float32", "float", "torch.int8", "int8"});
  if (name.find("int8") != std::string::npos) {
    dtype.fail("torch.autocast has no int8 mode", "use bfloat16 or float16");
  }
  if (name.find("32") != std::string::npos || name == "float") return MixedPrecision::kNo;
  return name.find("bf") != std::string::npos ? MixedPrecision::kBf16 : MixedPrecision::kFp16;
}

void read_torch_autocast(const Value& block, PrecisionBlocks& seen) {
  expect_map(block, "torch_autocast is a block: {\"enabled\": true, \"dtype\": \"bfloat16\"}");
  const MixedPrecision mode = autocast_dtype_mode(block.child("dtype"));
  const bool device_default = block.child("dtype").is_null();
  for_each_key(block, deepspeed_torch_autocast_keys(), [&](const std::string& key, const Value& v) {
    if (key == "enabled" && v.as_bool()) {
      seen.autocast_on = v;
      seen.autocast_mode = mode;
      seen.autocast_device_default = device_default;
    }
  });
}

// torch_autocast next to an fp16 or bf16 block: the same half type is one
// mode (DeepSpeed's half-precision parameters under autocast), a different
// one is a clash.
void apply_torch_autocast(const PrecisionBlocks& seen, Config& config) {
  if (!seen.autocast_on || seen.autocast_mode == MixedPrecision::kNo) return;
  const Value& v = *seen.autocast_on;
  if (seen.autocast_device_default) {
    // No dtype: the device decides, unless a half block already did.
    if (!seen.fp16_on.empty()) {
      config.mixed_precision = MixedPrecision::kFp16;
      return;
    }
    config.autocast_device_default = seen.bf16_on.empty();
  }
  const std::string dtype = to_string(seen.autocast_mode);
  if (!seen.fp16_on.empty() && seen.autocast_mode != MixedPrecision::kFp16) {
    v.fail("torch_autocast casts to " + dtype + " but " + seen.fp16_on + " is true",
           "give torch_autocast.dtype float16, or turn the fp16 block off");
  }
  if (!seen.bf16_on.empty() && seen.autocast_mode != MixedPrecision::kBf16) {
    v.fail("torch_autocast casts to " + dtype + " but " + seen.bf16_on + " is true",
           "give torch_autocast.dtype bfloat16, or turn the bf16 block off");
  }
  config.mixed_precision = seen.autocast_mode;
  config.key_locations[kDeepSpeedPrecisionKey] = v.where() + " (" + v.path() + ")";
}

}  // namespace

bool read_shared_training_key(const std::string& key, const Value& v, Config& config) {
  if (key == "gradient_clipping") {
    if (v.is_auto()) {
      v.note_auto();  // the program may set it; else what Accelerate fills in
      config.gradient_clipping = kDeepSpeedGradientClipping;
    } else {
      config.gradient_clipping = v.as_number(0.0, std::numeric_limits<double>::infinity(),
                                             "set it to 0 (no clipping) or a positive max norm");
    }
  } else if (key == "wall_clock_breakdown") {
    config.wall_clock_breakdown = v.as_bool();
  } else if (key == "steps_per_print") {
    // Not given, or null (DeepSpeed's default): no progress line. 0 would
    // be a modulo by zero in DeepSpeed's engine.
    config.steps_per_print = v.is_null() ? std::nullopt : std::optional<int64_t>(v.as_int(1));
  } else {
    return false;
  }
  return true;
}

bool read_loss_scale_key(const std::string& key, const Value& v, LossScaleConfig& scale) {
  if (key == "loss_scale") {
    scale.loss_scale = v.as_number(0.0, std::numeric_limits<double>::infinity(),
                                   "set it to 0 (dynamic scaling) or a positive static scale");
  } else if (key == "initial_scale_power") {
    scale.initial_scale_power = static_cast<int>(v.as_int(0, 63));
  } else if (key == "loss_scale_window") {
    // null: the rule's own default (DeepSpeed's 1000, torch's 2000).
    scale.loss_scale_window =
        v.is_null() ? std::nullopt : std::optional<int64_t>(v.as_count());
  } else if (key == "hysteresis") {
    scale.hysteresis = static_cast<int>(v.as_int(1, 1 << 30));
  } else if (key == "consecutive_hysteresis") {
    scale.consecutive_hysteresis = v.as_bool();
  } else if (key == "min_loss_scale") {
    scale.min_loss_scale = v.as_positive_number();
  } else {
    return false;
  }
  return true;
}

const KeyTable& deepspeed_top_level_keys() {
  static const KeyTable table{{"train_batch_size", "train_micro_batch_size_per_gpu",
                               "gradient_accumulation_steps", "optimizer", "scheduler", "fp16",
                               "bf16", "bfloat16", "zero_optimization", "gradient_clipping",
                               "tensor_parallel", "sequence_parallel_size",
                               "activation_checkpointing", "zero_allow_untested_optimizer",
                               "wall_clock_breakdown", "steps_per_print", "torch_autocast",
                               "tensorboard", "csv_monitor", "allgather_size"},
                              warned_top_level_keys(), removed_keys()};
  return table;
}

const KeyTable& deepspeed_fp16_keys() {
  static const KeyTable table{
      {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
       "consecutive_hysteresis", "min_loss_scale"},
      {{"auto_cast", "is not implemented: tandem casts the forward pass to fp16 under "
                     "autocast, whatever this says; ignored", {"false"}},
       {"fp16_master_weights_and_grads", "is not implemented: tandem keeps fp32 master weights "
                                         "and gradients; ignored", {"false"}}},
      {}};
  return table;
}

const KeyTable& deepspeed_bf16_keys() {
  static const KeyTable table{
      {"enabled"},
      notes_for({"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                 "bf16_optimizer_states"},
                "is not implemented: tandem keeps fp32 master weights, gradients and optimizer "
                "state under bf16, and checks no bf16 overflow; ignored",
                {"false"}),
      {}};
  return table;
}

const KeyTable& deepspeed_torch_autocast_keys() {
  static const KeyTable table{
      {"enabled", "dtype"},
      {{"lower_precision_safe_modules",
        "names the Python module classes whose gradients DeepSpeed reduces in the autocast "
        "dtype: tandem reduces every gradient in its parameter's dtype (fp32); ignored",
        {}, [](const Value& v) {
          for (const Value& name : v.elements()) (void)name.as_string();
        }}},
      {}};
  return table;
}

// DeepSpeed's tensorboard / csv_monitor block.
void read_monitor(const Value& block, MonitorConfig& monitor) {
  expect_map(block, "write it as {\"enabled\": true, \"output_path\": \"logs/\", "
                    "\"job_name\": \"run1\"}");
  for_each_key(block, deepspeed_monitor_keys(), [&](const std::string& key, const Value& v) {
    if (key == "enabled") monitor.enabled = v.as_bool();
    if (key == "output_path") monitor.output_path = v.is_null() ? "" : v.as_string();
    if (key == "job_name") monitor.job_name = v.as_string();
  });
}

const KeyTable& deepspeed_monitor_keys() {
  static const KeyTable table{{"enabled", "output_path", "job_name"}, {}, {}};
  return table;
}

void read_deepspeed_document(const Value& root, Config& config, bool accelerate_file) {
  config.distributed_type = DistributedType::kDeepSpeed;
  // DeepSpeed clips at 1.0 unless told otherwise (GRADIENT_CLIPPING_DEFAULT),
  // and Accelerate and HF's Trainer fill "auto" with 1.0 (max_grad_norm's
  // default): "auto" keeps it, listed in auto_keys for the program to set.
  config.gradient_clipping = kDeepSpeedGradientClipping;
  PrecisionBlocks precision;
  for_each_key(root, deepspeed_top_level_keys(), [&](const std::string& key, const Value& v) {
    if (read_shared_training_key(key, v, config)) return;
    if (key == "train_batch_size") {
      config.train_batch_size = read_batch_count(v);
    } else if (key == "train_micro_batch_size_per_gpu") {
      config.train_micro_batch_size_per_gpu = read_batch_count(v);
    } else if (key == "gradient_accumulation_steps") {
      config.gradient_accumulation_steps = read_batch_count(v);
    } else if (key == "optimizer") {
      read_optimizer(v, config, Dialect::kDeepSpeed);
    } else if (key == "scheduler") {
      read_scheduler(v, config);
    } else if (key == "fp16") {
      read_fp16(v, config, precision);
    } else if (key == "bf16" || key == "bfloat16") {
      read_bf16(v, config, precision);
    } else if (key == "zero_optimization") {
      if (is_zero_optimization_flag(v)) {
        if (accelerate_file) {
          // HfDeepSpeedConfig.get_value("zero_optimization.stage"):
          // AttributeError: 'bool' object has no attribute 'get'.
          v.fail("Accelerate's DeepSpeedPlugin reads zero_optimization.stage and fails on "
                 "DeepSpeed's deprecated true/false form",
                 "write \"zero_optimization\": {\"stage\": 1} (or 0 for false)");
        }
        read_zero_optimization_flag(v, root.child("allgather_size"), config);
      } else {
        read_zero_optimization(v, config, Dialect::kDeepSpeed);
      }
    } else if (key == "allgather_size") {
      // Read beside `"zero_optimization": true` (above), the only place
      // DeepSpeed looks at it.
      const Value zero = root.child("zero_optimization");
      if (!is_zero_optimization_flag(zero) || !zero.as_bool()) {
        v.fail("DeepSpeed reads it only beside the deprecated \"zero_optimization\": true, so "
               "here it would change nothing",
               "remove it, or write \"zero_optimization\": {\"stage\": 1, "
               "\"allgather_bucket_size\": N}");
      }
    } else if (key == "activation_checkpointing") {
      read_activation_checkpointing(v, config, Dialect::kDeepSpeed);
    } else if (key == "zero_allow_untested_optimizer") {
      // DeepSpeed's gate for optimizers it has not tested with ZeRO; tandem
      // shards every optimizer it builds, so either value trains the same
      // (a user's optimizer ZeRO does not know goes through
      // AcceleratorOptions::zero_shard_optimizer_factory).
      (void)v.as_bool();
    } else if (key == "tensor_parallel" || key == "sequence_parallel_size") {
      read_deepspeed_parallelism(v, key);
    } else if (key == "torch_autocast") {
      read_torch_autocast(v, precision);
    } else if (key == "tensorboard" || key == "csv_monitor") {
      read_monitor(v, key == "tensorboard" ? config.tensorboard : config.csv_monitor);
    }
  });
  apply_torch_autocast(precision, config);
}

Config parse_deepspeed_text(const std::string& text, const std::string& name,
                            bool accelerate_file) {
  Config config;
  config.format = ConfigFormat::kDeepSpeedJson;
  config.source_path = name;
  ReadContext ctx{name, &config};
  YAML::Node node = parse_document(text, name, looks_like_json(text));
  Value root = Value::root(ctx, node);
  expect_map(root, "a DeepSpeed config is one JSON object: { \"train_batch_size\": ..., ... }");
  read_deepspeed_document(root, config, accelerate_file);
  check_keys_read(ctx);
  return config;
}

}  // namespace tandem::config_detail
