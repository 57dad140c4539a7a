// DeepSpeed's zero_optimization block, as DeepSpeed JSON and tandem YAML
// write it.

#include <map>
#include <utility>

#include <fmt/format.h>

#include "config/readers.h"

namespace tandem::config_detail {
namespace {

OffloadDevice read_device(const Value& v) {
  if (v.is_null()) return OffloadDevice::kNone;
  if (v.node().IsScalar() && (v.node().Scalar() == "nvme" || v.node().Scalar() == "NVMe")) {
    v.fail("NVMe offload is not supported by tandem", "use \"cpu\" or \"none\"");
  }
  return v.as_choice({"none", "cpu"}) == "cpu" ? OffloadDevice::kCpu : OffloadDevice::kNone;
}

// offload_optimizer / offload_param: {device, pin_memory, ...}.
void read_offload(const Value& block, bool optimizer, OffloadDevice& device, Config& config) {
  for_each_key(block, offload_keys(optimizer), [&](const std::string& key, const Value& v) {
    if (key == "device") device = read_device(v);
    if (key == "pin_memory") {
      (optimizer ? config.zero.offload_pin_memory : config.zero.offload_param_pin_memory) =
          v.as_bool();
    }
  });
}

// A size in elements: a whole number >= `min`, or "auto" where HF's Trainer
// writes it (the default then stays).
int64_t read_size(const Value& v, int64_t current, int64_t min, bool auto_allowed,
                  const std::string& fix = "") {
  if (auto_allowed && v.is_auto()) {
    v.note_auto();
    return current;
  }
  return v.as_int(min, std::numeric_limits<int64_t>::max(), fix);
}

}  // namespace

// DeepSpeed's two offload models take different keys (and refuse the
// other's, as tandem does).
const KeyTable& offload_keys(bool optimizer) {
  static const std::string tunes =
      "tunes DeepSpeed's NVMe or partial offload: tandem offloads the whole state to CPU "
      "memory; ignored";
  static const KeyTable optimizer_table{
      {"device", "pin_memory"},
      [] {
        // Quiet at DeepSpeed's defaults (DeepSpeedZeroOffloadOptimizerConfig):
        // ratio 1.0 is what tandem does, offloading all of the state.
        std::vector<KeyNote> keys;
        for (const auto& [key, quiet] : std::vector<std::pair<std::string, std::vector<std::string>>>{
                 {"nvme_path", {"null"}},
                 {"buffer_count", {"4"}},
                 {"pipeline_read", {"false"}},
                 {"pipeline_write", {"false"}},
                 {"fast_init", {"false"}},
                 {"ratio", {"1", "1.0"}}}) {
          for (auto& n : notes_for({key}, tunes, quiet)) keys.push_back(std::move(n));
        }
        for (auto& n : notes_for({"super_offload", "cpuadam_cores_perc"},
                                 "tunes DeepSpeed's SuperOffload CPU optimizer: tandem's CPU Adam "
                                 "uses the intra-op threads; ignored",
                                 {"false"})) {
          keys.push_back(std::move(n));
        }
        return keys;
      }(),
      notes_for({"buffer_size", "max_in_cpu", "pipeline"},
                "is not a key of offload_optimizer (DeepSpeed refuses it too: buffer_size and "
                "max_in_cpu belong to offload_param, pipeline is pipeline_read/pipeline_write); "
                "remove it")};
  static const KeyTable param_table{
      {"device", "pin_memory"},
      [] {
        // Quiet at DeepSpeed's defaults (DeepSpeedZeroOffloadParamConfig).
        std::vector<KeyNote> keys;
        for (const auto& [key, quiet] : std::vector<std::pair<std::string, std::vector<std::string>>>{
                 {"nvme_path", {"null"}},
                 {"buffer_count", {"5"}},
                 {"buffer_size", {"1e8", "100000000", "1.0e8"}},
                 {"max_in_cpu", {"1e9", "1000000000", "1.0e9"}}}) {
          for (auto& n : notes_for({key}, tunes, quiet)) keys.push_back(std::move(n));
        }
        return keys;
      }(),
      notes_for({"pipeline_read", "pipeline_write", "pipeline", "fast_init", "ratio",
                 "super_offload", "cpuadam_cores_perc"},
                "is not a key of offload_param (DeepSpeed refuses it too; it belongs to "
                "offload_optimizer); remove it")};
  return optimizer ? optimizer_table : param_table;
}

namespace {

// DeepSpeed's spellings of one number ("5e8", 500000000), for quiet values.
std::vector<std::string> spellings(const std::string& exponent_form, const std::string& digits) {
  return {exponent_form, digits, exponent_form.substr(0, 1) + ".0" + exponent_form.substr(1),
          "auto"};
}

std::vector<KeyNote> zero_warned_keys() {
  std::vector<KeyNote> keys = notes_for(
      {"round_robin_gradients", "load_from_fp32_weights", "elastic_checkpoint",
       "ignore_unused_parameters", "legacy_stage1",
       "zero_quantized_weights", "zero_quantized_nontrainable_weights",
       "zero_quantized_gradients", "memory_efficient_linear",
       "stage3_model_persistence_threshold", "model_persistence_threshold",
       "stage3_module_granularity_threshold", "module_granularity_threshold",
       "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
       "stage3_allgather_sequential", "allgather_sequential", "parameter_alignment",
       "use_multi_rank_bucket_allreduce", "override_module_apply",
       "pipeline_loading_checkpoint", "log_trace_cache_warnings", "enable_sanity_checks",
       "leaf_module", "zenflow"},
      "is not implemented by tandem's ZeRO; ignored");
  auto add = [&](const std::vector<std::string>& names, const std::string& note,
                 const std::vector<std::string>& quiet,
                 const std::function<void(const Value&)>& check) {
    for (auto& n : notes_for(names, note, quiet, check)) keys.push_back(std::move(n));
  };
  add({"compute_grad_norm"}, "is not implemented: tandem computes the gradient norm when "
                             "clipping asks for it; ignored", {"true"}, check_bool);
  add({"save_muon_momentum_buffer_in_memory"},
      "tunes DeepSpeed's Muon optimizer, which tandem does not have; ignored", {"false"},
      check_bool);
  add({"contiguous_gradients"},
      "false is not implemented: tandem's reduce-scatter needs each bucket's (or unit's) "
      "gradients in one flat buffer, so they are always packed as they arrive (true); ignored",
      {"true"}, check_bool);
  add({"allgather_partitions"}, "is not implemented: tandem always all-gathers the updated "
                                "partitions; ignored", {"true"}, check_bool);
  add({"sub_group_size"}, "is not implemented: tandem steps each rank's shard as one group; "
                          "ignored", spellings("1e9", "1000000000"), check_whole(1));
  add({"stage3_max_reuse_distance", "max_reuse_distance"},
      "is not implemented: tandem releases a gathered parameter after its use (and keeps what "
      "prefetching and stage3_max_live_parameters allow); ignored",
      spellings("1e9", "1000000000"), check_whole(0));
  return keys;
}

}  // namespace

const KeyTable& zero_optimization_keys(Dialect dialect) {
  // DeepSpeed's pydantic model takes the stage3_* names and their short
  // field names alike.
  static const std::vector<std::string> read_keys = {
      "stage", "offload_optimizer", "offload_param", "reduce_bucket_size",
      "stage3_prefetch_bucket_size", "prefetch_bucket_size",
      "stage3_param_persistence_threshold", "param_persistence_threshold",
      "stage3_max_live_parameters", "max_live_parameters", "cpu_offload", "cpu_offload_param",
      "cpu_offload_use_pin_memory", "allgather_bucket_size", "reduce_scatter", "overlap_comm",
      "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
      "gather_16bit_weights_on_model_save", "zero_hpz_partition_size"};
  static const std::vector<KeyNote> removed = notes_for(
      {"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"},
      "DeepSpeed has removed this feature, and current DeepSpeed refuses a config that still "
      "has the key (deepspeedai/DeepSpeed#8489); remove the key");
  static const KeyTable deepspeed_table{read_keys, zero_warned_keys(), removed};
  static const KeyTable tandem_table = [] {
    KeyTable table{read_keys, zero_warned_keys(), removed};
    for (const char* key : {"zero3_init", "auto_wrap_policy", "auto_wrap_min_num_params",
                            "auto_wrap_layer_types"}) {
      table.read.push_back(key);
    }
    return table;
  }();
  return dialect == Dialect::kTandem ? tandem_table : deepspeed_table;
}

bool is_zero_optimization_flag(const Value& value) {
  // A quoted "true" is a string to DeepSpeed, which then refuses it.
  const YAML::Node& node = value.node();
  return node.IsScalar() && !value.is_quoted() &&
         (node.Scalar() == "true" || node.Scalar() == "false");
}

void read_zero_optimization_flag(const Value& flag, const Value& allgather_size,
                                 Config& config) {
  const bool on = flag.as_bool();
  config.zero.stage = on ? 1 : 0;
  const bool bucket = on && !allgather_size.is_null();
  if (bucket) {
    config.zero.allgather_bucket_size =
        read_size(allgather_size, config.zero.allgather_bucket_size, 1, false);
  }
  // DeepSpeed warns too ("this format of ZeRO optimization setup is
  // deprecated").
  const std::string block =
      bucket ? fmt::format("{{\"stage\": 1, \"allgather_bucket_size\": {}}} in place of both",
                           config.zero.allgather_bucket_size)
             : fmt::format("{{\"stage\": {}}}", config.zero.stage);
  // Not "'zero_optimization'" in quotes: that form names a key tandem
  // does not implement (KeyDisposition::kWarn), and this one it reads.
  config.warnings.push_back(fmt::format(
      "{}: zero_optimization: {} is DeepSpeed's deprecated form, read as ZeRO stage {} as "
      "DeepSpeed reads it; write \"zero_optimization\": {}",
      flag.where(), on ? "true" : "false", config.zero.stage, block));
}

void read_zero_optimization(const Value& block, Config& config, Dialect dialect) {
  ZeroConfig& zero = config.zero;
  std::map<std::string, Value> given;  // for the deprecated spellings below
  for_each_key(block, zero_optimization_keys(dialect),
               [&](const std::string& key, const Value& v) {
    given.emplace(key, v);
    if (key == "stage") {
      zero.stage = static_cast<int>(v.as_int(0, 3, "set it to 0, 1, 2 or 3"));
    } else if (key == "offload_optimizer") {
      read_offload(v, /*optimizer=*/true, zero.offload_optimizer, config);
    } else if (key == "offload_param") {
      read_offload(v, /*optimizer=*/false, zero.offload_param, config);
    } else if (key == "reduce_bucket_size") {
      // In tandem YAML 0 means every gradient is reduced on its own (a
      // bucket is flushed once it would exceed the size). DeepSpeed's
      // pydantic model refuses 0 (gt=0), so a DeepSpeed JSON must say 1.
      zero.reduce_bucket_size =
          dialect == Dialect::kDeepSpeed
              ? read_size(v, zero.reduce_bucket_size, 1, true,
                          "DeepSpeed requires reduce_bucket_size > 0; 1 reduces each gradient "
                          "on its own")
              : read_size(v, zero.reduce_bucket_size, 0, true);
    } else if (key == "stage3_prefetch_bucket_size" || key == "prefetch_bucket_size") {
      // 0 is meaningful: no prefetching.
      zero.stage3_prefetch_bucket_size = read_size(v, zero.stage3_prefetch_bucket_size, 0, true);
    } else if (key == "stage3_param_persistence_threshold" ||
               key == "param_persistence_threshold") {
      // 0 is meaningful: partition every parameter.
      zero.stage3_param_persistence_threshold =
          read_size(v, zero.stage3_param_persistence_threshold, 0, true);
    } else if (key == "stage3_max_live_parameters" || key == "max_live_parameters") {
      zero.stage3_max_live_parameters = read_size(v, zero.stage3_max_live_parameters, 1, false);
    } else if (key == "cpu_offload") {  // DeepSpeed's deprecated spelling
      if (v.as_bool()) zero.offload_optimizer = OffloadDevice::kCpu;
    } else if (key == "cpu_offload_param") {
      if (v.as_bool()) zero.offload_param = OffloadDevice::kCpu;
    } else if (key == "cpu_offload_use_pin_memory") {
      zero.offload_pin_memory = v.as_bool();  // the deprecated key is both blocks'
      zero.offload_param_pin_memory = zero.offload_pin_memory;
    } else if (key == "zero_hpz_partition_size") {
      // Whether it divides the world is known at resolve_config(). tandem
      // YAML also says `ranks_per_host` (what FSDP's HYBRID_SHARD maps to).
      if (dialect == Dialect::kTandem && v.node().IsScalar() && !v.is_quoted() &&
          v.node().Scalar() == "ranks_per_host") {
        zero.hpz_partition_size = kHpzRanksPerHost;
        return;
      }
      zero.hpz_partition_size = static_cast<int>(
          v.as_int(1, std::numeric_limits<int>::max(),
                   dialect == Dialect::kTandem
                       ? "1 turns HSDP off; a size P > 1 shards inside groups of P ranks and "
                         "replicates across them; ranks_per_host takes P from the launcher"
                       : "1 turns HSDP off; a size P > 1 shards inside groups of P ranks (the "
                         "ranks of one host, usually) and replicates across them"));
    } else if (key == "zero3_init") {
      zero.zero3_init = v.as_bool();
    } else if (key == "auto_wrap_policy") {
      zero.auto_wrap_policy = read_auto_wrap_policy(v);
    } else if (key == "auto_wrap_min_num_params") {
      zero.auto_wrap_min_num_params = v.as_int(0);
    } else if (key == "auto_wrap_layer_types") {
      zero.auto_wrap_layer_types = read_layer_types(v);
    } else if (key == "allgather_bucket_size") {
      // "auto" keeps the default, as for the other sizes.
      zero.allgather_bucket_size = read_size(v, zero.allgather_bucket_size, 1, true);
    } else if (key == "reduce_scatter") {
      zero.reduce_scatter = v.as_bool();
    } else if (key == "overlap_comm") {
      zero.overlap_comm = v.as_bool();
    } else if (key == "stage3_gather_16bit_weights_on_model_save" ||
               key == "stage3_gather_fp16_weights_on_model_save" ||
               key == "gather_16bit_weights_on_model_save") {
      // "auto" (as some templates write it) is taken as true: save_model
      // then writes what it can, the gathered 16-bit weights.
      zero.gather_16bit_weights_on_model_save = v.is_auto() || v.as_bool();
    }
  });
  // DeepSpeed's deprecated-field check: "Cannot provide deprecated parameter
  // 'cpu_offload' and replacing parameter 'offload_optimizer' together".
  for (const auto& [old_key, new_key] : {std::pair<std::string, std::string>{
                                             "cpu_offload", "offload_optimizer"},
                                         {"cpu_offload_param", "offload_param"}}) {
    auto deprecated = given.find(old_key);
    if (deprecated != given.end() && given.count(new_key)) {
      deprecated->second.fail(
          "the deprecated spelling of " + new_key + ", which is given too (DeepSpeed refuses "
          "both together)",
          "remove " + old_key + " and keep " + new_key);
    }
  }
}

}  // namespace tandem::config_detail
