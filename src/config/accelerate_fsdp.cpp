// Accelerate's fsdp_config (distributed_type: FSDP) mapped onto the ZeRO
// and HSDP settings tandem trains with: FULL_SHARD is ZeRO-3, SHARD_GRAD_OP
// ZeRO-2, NO_SHARD DDP, HYBRID_SHARD and HYBRID_SHARD_ZERO2 the same with
// shard groups of one host's ranks. Keys, spellings and defaults are those of
// accelerate 1.15's launcher (commands/launch.py, utils/launch.py) and of the
// FullyShardedDataParallelPlugin it builds from the environment it exports;
// docs/config.md ("FSDP") has the table.

#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

#include "config/did_you_mean.h"
#include "config/readers.h"

namespace tandem::config_detail {
namespace {

const std::string kPrefix = "fsdp_";

// Accelerate's launcher copies fsdp_config's `x` to its argument fsdp_x.
std::string canonical_fsdp_key(const std::string& key) {
  return key.compare(0, kPrefix.size(), kPrefix) == 0 ? key : kPrefix + key;
}

// FSDP1's ShardingStrategy names in torch's numbering (FULL_SHARD = 1).
const std::vector<std::string>& sharding_names() {
  static const std::vector<std::string> names = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                                 "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};
  return names;
}

// One of `names` in any case, or the number of names[i] (i + 1) for i below
// `numbered`, as Accelerate takes sharding strategies, backward prefetch and
// state dict types (an enum name, or its value as a number or digits).
// `aliases` maps other accepted names to canonical ones.
std::string read_enum(const Value& v, const std::vector<std::string>& names, size_t numbered,
                      const std::map<std::string, std::string>& aliases = {}) {
  if (v.node().IsScalar()) {
    std::string upper = v.node().Scalar();
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const auto& name : names) {
      if (name == upper) return name;
    }
    auto alias = aliases.find(upper);
    if (alias != aliases.end()) return alias->second;
    bool digits = !upper.empty() && upper.size() < 4;
    for (char c : upper) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    if (digits && std::stoi(upper) >= 1 && static_cast<size_t>(std::stoi(upper)) <= numbered) {
      return names[std::stoi(upper) - 1];
    }
  }
  const std::string numbers =
      numbered == 0 ? "" : fmt::format(", or the number of one of the first {} (1-{})",
                                       numbered, numbered);
  std::string guess = v.node().IsScalar() ? closest_candidate(v.node().Scalar(), names) : "";
  v.fail("expected " + join_alternatives(names) + " (any case" + numbers + "), got " +
             v.describe(),
         guess.empty() ? "write one of " + join_alternatives(names)
                       : "did you mean " + guess + "?");
}

std::string read_sharding(const Value& v) {
  // torch's own enum name for the fifth is _HYBRID_SHARD_ZERO2.
  return read_enum(v, sharding_names(), 5, {{"_HYBRID_SHARD_ZERO2", "HYBRID_SHARD_ZERO2"}});
}

bool yaml_bool(const Value& v) {
  bool ignored = false;
  return v.node().IsScalar() && !v.is_quoted() && YAML::convert<bool>::decode(v.node(), ignored);
}

void warn(Config& config, const Value& v, const std::string& what) {
  config.warnings.push_back(fmt::format("{}: '{}' {}", v.where(), v.path(), what));
}

// The settings one key at a time gives, before they become ZeroConfig's.
struct FsdpRead {
  std::map<std::string, Value> given;  // by canonical key
  int version = 1;
  int stage = 3;
  bool hybrid = false;  // shard inside a host, replicate across hosts
  const Value* strategy = nullptr;  // the key that chose the stage, if any
};

const Value* find(const FsdpRead& f, const std::string& key) {
  auto it = f.given.find(key);
  return it == f.given.end() ? nullptr : &it->second;
}

// fsdp_sharding_strategy, or under FSDP1 fsdp_reshard_after_forward, which
// Accelerate 1.15 documents as the strategy's new name (`accelerate config`
// writes it) but its launcher drops (docs/config.md, "FSDP").
void read_fsdp1_sharding(FsdpRead& f) {
  const Value* strategy = find(f, "fsdp_sharding_strategy");
  const Value* reshard = find(f, "fsdp_reshard_after_forward");
  if (reshard && yaml_bool(*reshard)) {
    reshard->fail("under fsdp_version 1 this names the sharding strategy, and true/false are "
                  "FSDP2's (Accelerate's plugin refuses them here)",
                  "write FULL_SHARD (what true means under FSDP2) or SHARD_GRAD_OP (false), or "
                  "set fsdp_version: 2");
  }
  std::string name = "FULL_SHARD";
  if (strategy) {
    name = read_sharding(*strategy);
    f.strategy = strategy;
    if (reshard && read_sharding(*reshard) != name) {
      reshard->fail(read_sharding(*reshard) + " disagrees with fsdp_sharding_strategy: " + name +
                        " at " + strategy->where() + ", which Accelerate prefers",
                    "keep one of the two keys");
    }
  } else if (reshard) {
    name = read_sharding(*reshard);
    f.strategy = reshard;
  }
  f.stage = name == "NO_SHARD" ? 0 : (name == "FULL_SHARD" || name == "HYBRID_SHARD") ? 3 : 2;
  f.hybrid = name == "HYBRID_SHARD" || name == "HYBRID_SHARD_ZERO2";
}

void read_fsdp2_sharding(FsdpRead& f, Config& config) {
  if (const Value* reshard = find(f, "fsdp_reshard_after_forward")) {
    if (!yaml_bool(*reshard)) {
      reshard->fail("under fsdp_version 2 this is true or false, got " + reshard->describe(),
                    "FULL_SHARD is true and SHARD_GRAD_OP false (`accelerate to-fsdp2` rewrites "
                    "a version 1 config); for HSDP under FSDP2 give parallelism_config's "
                    "dp_replicate_size and dp_shard_size");
    }
    f.stage = reshard->as_bool() ? 3 : 2;
    f.strategy = reshard;
  }
  if (const Value* strategy = find(f, "fsdp_sharding_strategy")) {
    read_sharding(*strategy);  // a bad value is still an error
    warn(config, *strategy,
         "is FSDP1's: under fsdp_version 2 Accelerate ignores it and shards by "
         "fsdp_reshard_after_forward (HSDP: parallelism_config's dp_replicate_size and "
         "dp_shard_size), and so does tandem; ignored");
  }
}

// parallelism_config's data-parallel sizes (Accelerate's ParallelismConfig:
// S ranks shard, R copies replicate; 1 when not given).
struct DataParallelSizes {
  int64_t replicate = 1, shard = 1;
  std::optional<Value> replicate_value, shard_value;
  const Value& where() const { return replicate > 1 ? *replicate_value : *shard_value; }
};

DataParallelSizes data_parallel_sizes(const Value& parallelism) {
  DataParallelSizes out;
  if (parallelism.is_null() || !parallelism.is_map()) return out;
  for (auto it = parallelism.node().begin(); it != parallelism.node().end(); ++it) {
    if (!it->first.IsScalar()) continue;
    const std::string name = it->first.Scalar();
    auto ends = [&](const std::string& tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (ends("dp_replicate_size")) out.replicate_value = parallelism.child(name);
    if (ends("dp_shard_size")) out.shard_value = parallelism.child(name);
  }
  auto size = [](const std::optional<Value>& v) {
    return v && !v->is_null() ? v->as_int(1, 1 << 24) : int64_t{1};
  };
  out.replicate = size(out.replicate_value);
  out.shard = size(out.shard_value);
  return out;
}

// As Accelerate: the data-parallel sizes multiply to the world size.
void check_world(const DataParallelSizes& d, const Config& config) {
  const int64_t r = d.replicate, s = d.shard;
  if (config.num_processes && r * s != *config.num_processes) {
    d.where().fail(fmt::format("dp_replicate_size {} * dp_shard_size {} = {}, but num_processes "
                               "is {} (Accelerate requires them equal)",
                               r, s, r * s, *config.num_processes),
                   "make dp_replicate_size * dp_shard_size equal num_processes");
  }
}

// FSDP2's HSDP: R copies of shard groups of S ranks.
void read_data_parallel_sizes(const Value& parallelism, const FsdpRead& f, Config& config) {
  const DataParallelSizes d = data_parallel_sizes(parallelism);
  const int64_t r = d.replicate, s = d.shard;
  if (r == 1 && s == 1) return;
  const Value& at = d.where();
  if (f.version == 1) {
    at.fail("parallelism_config's data-parallel sizes apply to FSDP2 only (Accelerate refuses "
            "them under fsdp_version 1)",
            "for HSDP under FSDP1 set fsdp_config.fsdp_sharding_strategy: HYBRID_SHARD, or set "
            "fsdp_config.fsdp_version: 2");
  }
  if (s == 1) {
    at.fail("dp_replicate_size above 1 with dp_shard_size 1 gives FSDP nothing to shard "
            "(Accelerate refuses it)",
            "set dp_shard_size to the ranks that shard the model (HSDP), or use "
            "distributed_type MULTI_GPU for plain data parallel");
  }
  check_world(d, config);
  if (r > 1) {
    config.zero.hpz_partition_size = static_cast<int>(s);
    config.key_locations["zero_optimization.zero_hpz_partition_size"] = d.shard_value->where();
  }
}

// fsdp_offload_params: what tandem's ZeRO offload can do at the stage.
void read_offload(const Value& v, int stage, Config& config) {
  if (!v.as_bool()) return;
  ZeroConfig& zero = config.zero;
  if (stage == 3) {
    zero.offload_param = OffloadDevice::kCpu;
    zero.offload_optimizer = OffloadDevice::kCpu;
  } else if (stage == 2) {
    zero.offload_optimizer = OffloadDevice::kCpu;
    warn(config, v,
         "at ZeRO-2 (SHARD_GRAD_OP) keeps the optimizer state, the fp32 master weights and the "
         "gradient shards on the CPU and steps there, but the parameters stay on the device: "
         "tandem offloads parameters at stage 3 (FULL_SHARD) only");
  } else {
    warn(config, v,
         "offloads nothing under NO_SHARD: tandem trains it as DDP, which keeps everything on "
         "the device; use FULL_SHARD to offload; ignored");
  }
}

// FSDP1's prefetch keys onto tandem's one prefetch setting
// (stage3_prefetch_bucket_size, forward and backward alike).
void read_prefetch(const FsdpRead& f, Config& config) {
  const Value* backward = find(f, "fsdp_backward_prefetch");
  const Value* forward = find(f, "fsdp_forward_prefetch");
  const std::string policy =
      backward ? read_enum(*backward, {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"}, 2) : "";
  const bool ahead = forward && forward->as_bool();
  if (f.version == 2) {
    const char* note = "is FSDP1's: under fsdp_version 2 Accelerate drops it, and tandem "
                       "prefetches as FSDP2 does (zero_optimization.stage3_prefetch_bucket_size); "
                       "ignored";
    if (backward) warn(config, *backward, note);
    if (ahead) warn(config, *forward, note);
    return;
  }
  if (policy == "NO_PREFETCH" && !ahead) config.zero.stage3_prefetch_bucket_size = 0;
  if (f.stage != 3) return;  // nothing is gathered in backward below stage 3
  if (policy == "BACKWARD_POST") {
    warn(config, *backward,
         "prefetches too, but tandem issues a unit's prefetch when the unit's backward starts "
         "(BACKWARD_PRE's timing), not after it");
  } else if (policy == "NO_PREFETCH" && ahead) {
    warn(config, *backward,
         "cannot hold with fsdp_forward_prefetch: true: tandem's prefetch "
         "(stage3_prefetch_bucket_size) covers forward and backward alike, so backward is "
         "prefetched too");
  }
}

// fsdp_auto_wrap_policy and its two parameters, as Accelerate's FSDP plugin
// reads them: the layer names only for TRANSFORMER_BASED_WRAP, the size
// only for SIZE_BASED_WRAP (0, its default, wraps nothing). Without layer
// names a Python model's _no_split_modules stand in, which a C++ model has
// not: the Accelerator warns when it shards (strategy_factory.cpp).
void read_auto_wrap(const FsdpRead& f, Config& config) {
  ZeroConfig& zero = config.zero;
  const Value* policy = find(f, "fsdp_auto_wrap_policy");
  if (policy && !policy->is_null()) zero.auto_wrap_policy = read_auto_wrap_policy(*policy);
  const Value* layers = find(f, "fsdp_transformer_layer_cls_to_wrap");
  if (layers && !layers->is_null()) zero.auto_wrap_layer_types = read_layer_types(*layers);
  const Value* size = find(f, "fsdp_min_num_params");
  if (size && !size->is_null()) zero.auto_wrap_min_num_params = size->as_int(0);
  if (f.stage != 3 && !zero.auto_wrap_policy.empty()) {
    warn(config, *policy, "chooses the units ZeRO-3 gathers; at stage " +
                              std::to_string(f.stage) + " (" +
                              (f.stage == 2 ? "SHARD_GRAD_OP" : "NO_SHARD") +
                              ") no parameter is gathered, so it has no effect");
  }
}

}  // namespace

std::string read_auto_wrap_policy(const Value& v) {
  const std::string policy =
      read_enum(v, {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"}, 0);
  return policy == "NO_WRAP" ? "" : policy;
}

std::vector<std::string> read_layer_types(const Value& v) {
  std::vector<std::string> pieces;
  if (v.node().IsScalar()) {
    std::string text = v.node().Scalar();
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      pieces.push_back(text.substr(start, comma - start));
      start = comma + 1;
    }
  } else {
    v.fail("expected text, got " + v.describe(),
           "write the names as one comma-separated string, as Accelerate takes them");
  }
  std::vector<std::string> names;
  for (std::string& p : pieces) {
    const auto first = p.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    names.push_back(p.substr(first, p.find_last_not_of(" \t") - first + 1));
  }
  return names;
}

const KeyTable& accelerate_fsdp_keys() {
  static const KeyTable table = [] {
    auto choice = [](std::vector<std::string> names, size_t numbered) {
      return [names, numbered](const Value& v) { (void)read_enum(v, names, numbered); };
    };
    auto text = [](const Value& v) {
      if (!v.node().IsScalar()) v.fail("expected text, got " + v.describe(), "write the names as "
                                       "one comma-separated string, as Accelerate takes them");
    };
    KeyTable t{
        {"fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward",
         "fsdp_offload_params", "fsdp_activation_checkpointing", "fsdp_backward_prefetch",
         "fsdp_forward_prefetch", "fsdp_cpu_ram_efficient_loading", "fsdp_auto_wrap_policy",
         "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params"},
        {         {"fsdp_state_dict_type",
          "is not needed: tandem's save_state always writes each rank's shards (as "
          "SHARDED_STATE_DICT), which load at any world size and strategy, save_model writes "
          "the full weights, and `tandem checkpoint merge` makes one file of a checkpoint; "
          "ignored",
          {"SHARDED_STATE_DICT", "3", "null"},
          choice({"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"}, 3)},
         {"fsdp_use_orig_params", "is always true in tandem: the optimizer steps the model's own "
                                  "parameters (param groups and frozen parameters as given); "
                                  "ignored", {"true", "null"}, check_bool},
         {"fsdp_sync_module_states", "is always true in tandem: preparing the model broadcasts "
                                     "rank 0's parameters to every rank; ignored",
          {"true", "null"}, check_bool},
         {"fsdp_activation_checkpointing_offload",
          "is not implemented: checkpointed blocks keep their inputs on the device; ignored",
          {"false", "null"}, check_bool},
         {"fsdp_ignored_modules",
          "is not implemented: tandem shards every parameter the prepared optimizer holds "
          "(parameters outside every tandem::Sharded unit stay whole, their gradients and "
          "optimizer state sharded); ignored", {"null", ""}, text}},
        {}};
    // Accelerate's launcher reads `x` as fsdp_x: the same keys unprefixed.
    const size_t read = t.read.size(), warned = t.warned.size();
    for (size_t i = 0; i < read; ++i) t.read.push_back(t.read[i].substr(kPrefix.size()));
    for (size_t i = 0; i < warned; ++i) {
      KeyNote note = t.warned[i];
      note.key = note.key.substr(kPrefix.size());
      t.warned.push_back(note);
    }
    return t;
  }();
  return table;
}

void read_accelerate_fsdp(const Value& section, const Value& parallelism, Config& config) {
  FsdpRead f;
  expect_map(section, "write fsdp_config's settings as `key: value` entries");
  if (!section.is_null()) {
    for (auto it = section.node().begin(); it != section.node().end(); ++it) {
      if (!it->first.IsScalar()) continue;  // for_each_key says why
      const std::string key = canonical_fsdp_key(it->first.Scalar());
      Value v = section.child(it->first.Scalar());
      auto [first, added] = f.given.emplace(key, v);
      if (!added && first->second.path() != v.path()) {
        v.fail("the same setting as " + first->second.path() + " at " + first->second.where() +
                   " (Accelerate reads `x` here as fsdp_x)",
               "keep one of them");
      }
    }
  }
  // The implemented keys are read below, through `given`.
  for_each_key(section, accelerate_fsdp_keys(), [](const std::string&, const Value&) {});

  if (const Value* v = find(f, "fsdp_version")) {
    f.version = static_cast<int>(v->as_int(1, 2, "write 1 (FSDP1, Accelerate's default) or 2 "
                                                 "(FSDP2)"));
  }
  if (f.version == 1) {
    read_fsdp1_sharding(f);
  } else {
    read_fsdp2_sharding(f, config);
  }
  ZeroConfig& zero = config.zero;
  zero.stage = f.stage;
  if (f.strategy) config.key_locations["zero_optimization.stage"] = f.strategy->where();
  if (f.hybrid) {
    zero.hpz_partition_size = kHpzRanksPerHost;
    config.key_locations["zero_optimization.zero_hpz_partition_size"] = f.strategy->where();
  }
  read_data_parallel_sizes(parallelism, f, config);

  if (const Value* v = find(f, "fsdp_offload_params")) read_offload(*v, f.stage, config);
  const Value* checkpointing = find(f, "fsdp_activation_checkpointing");
  if (checkpointing) config.activation_checkpointing.enabled = checkpointing->as_bool();
  if (const Value* v = find(f, "fsdp_activation_checkpointing_offload"); v && v->as_bool()) {
    if (!config.activation_checkpointing.enabled || f.version != 2) {
      v->fail("needs fsdp_activation_checkpointing: true and fsdp_version: 2 (Accelerate refuses "
              "it otherwise)",
              "remove it, or turn on both");
    }
  }
  read_prefetch(f, config);
  read_auto_wrap(f, config);

  // Accelerate's launcher defaults fsdp_cpu_ram_efficient_loading to true
  // and refuses it with fsdp_sync_module_states false.
  const Value* efficient = find(f, "fsdp_cpu_ram_efficient_loading");
  const bool load_cut = efficient ? efficient->as_bool() : true;
  const Value* sync = find(f, "fsdp_sync_module_states");
  if (sync && load_cut && !sync->as_bool()) {
    sync->fail("Accelerate's launcher refuses fsdp_sync_module_states: false while "
               "fsdp_cpu_ram_efficient_loading is true (its default)",
               "set fsdp_cpu_ram_efficient_loading: false, or remove fsdp_sync_module_states");
  }
  zero.zero3_init = load_cut && f.stage == 3;
  if (efficient && load_cut && f.stage != 3) {
    warn(config, *efficient,
         "builds the whole model on every rank at ZeRO-2 and DDP (SHARD_GRAD_OP, NO_SHARD): "
         "tandem builds it cut to each rank's shard (accelerator.zero_init(), as DeepSpeed's "
         "zero3_init_flag) at stage 3 (FULL_SHARD) only");
  }
  if (const Value* type = find(f, "fsdp_state_dict_type"); type && f.version == 2) {
    if (read_enum(*type, {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"}, 3) ==
        "LOCAL_STATE_DICT") {
      type->fail("FSDP2 has no LOCAL_STATE_DICT (Accelerate refuses it under fsdp_version 2)",
                 "write SHARDED_STATE_DICT or FULL_STATE_DICT");
    }
  }
}

void read_accelerate_data_parallel_sizes(const Value& parallelism, Config& config) {
  const DataParallelSizes d = data_parallel_sizes(parallelism);
  if (d.replicate == 1 && d.shard == 1) return;
  check_world(d, config);
  if (d.shard > 1) {
    warn(config, *d.shard_value,
         fmt::format("shards only under distributed_type FSDP (version 2); under {} tandem "
                     "trains every rank as a data-parallel replica, so "
                     "the size has no effect (for HSDP use FSDP with dp_replicate_size, or "
                     "zero_optimization.zero_hpz_partition_size in a DeepSpeed file)",
                     to_string(config.distributed_type)));
  }
}

}  // namespace tandem::config_detail
