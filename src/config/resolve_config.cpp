// resolve_config(): file < environment < code overrides, then the batch
// triple train = micro * accumulation * world_size.

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <fmt/ranges.h>

#include "config/readers.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

// Where each number of the triple came from, for the error message.
struct TripleOrigin {
  std::string train;
  std::string micro;
  std::string accumulation;
};

std::string file_origin(const Config& config, const std::string& path) {
  auto it = config.key_locations.find(path);
  if (it != config.key_locations.end()) return it->second;
  return config.source_path.empty() ? "defaults" : config.source_path;
}

class TripleSolver {
 public:
  TripleSolver(Config& config, TripleOrigin origin, int world_size)
      : c_(config), origin_(std::move(origin)), world_(world_size) {}

  void solve() {
    auto& train = c_.train_batch_size;
    auto& micro = c_.train_micro_batch_size_per_gpu;
    auto& accumulation = c_.gradient_accumulation_steps;
    if (train && micro && accumulation) {
      if (*train != *micro * *accumulation * world_) {
        fail(fmt::format("{} != train_micro_batch_size_per_gpu {} * gradient_accumulation_steps "
                         "{} * world_size {} = {}",
                         *train, *micro, *accumulation, world_,
                         *micro * *accumulation * world_));
      }
    } else if (train && micro) {
      accumulation = divide(*micro * world_,
                            fmt::format("train_micro_batch_size_per_gpu {} * world_size {} = {}",
                                        *micro, world_, *micro * world_),
                            "gradient_accumulation_steps");
    } else if (train && accumulation) {
      micro = divide(*accumulation * world_,
                     fmt::format("gradient_accumulation_steps {} * world_size {} = {}",
                                 *accumulation, world_, *accumulation * world_),
                     "train_micro_batch_size_per_gpu");
    } else if (micro && accumulation) {
      train = *micro * *accumulation * world_;
    } else if (train) {
      // DeepSpeed's rule: accumulation 1, the micro batch takes the rest.
      accumulation = 1;
      origin_.accumulation = "the default";
      micro = divide(world_, fmt::format("world_size {}", world_), "train_micro_batch_size_per_gpu");
    } else {
      if (!accumulation) accumulation = 1;
      if (micro) train = *micro * *accumulation * world_;
    }
  }

 private:
  int64_t divide(int64_t divisor, const std::string& divisor_text, const std::string& unknown) {
    int64_t train = *c_.train_batch_size;
    if (train % divisor != 0) {
      fail(fmt::format("{} is not a multiple of {}, so {} cannot be derived", train, divisor_text,
                       unknown));
    }
    return train / divisor;
  }

  [[noreturn]] void fail(const std::string& what) {
    TANDEM_THROW(UsageError,
                 "{}: train_batch_size: {} (train_batch_size {}; train_micro_batch_size_per_gpu "
                 "{}; gradient_accumulation_steps {}; world_size {}); make train_batch_size = "
                 "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size: "
                 "change one of them, or set train_batch_size to \"auto\" and tandem derives it",
                 origin_.train, what, with_origin(c_.train_batch_size, origin_.train),
                 with_origin(c_.train_micro_batch_size_per_gpu, origin_.micro),
                 with_origin(c_.gradient_accumulation_steps, origin_.accumulation), world_);
  }

  // "4 from ds.json:3:37", or "auto" for a number nobody gave.
  static std::string with_origin(const std::optional<int64_t>& value, const std::string& origin) {
    return value ? fmt::format("{} from {}", *value, origin) : "auto";
  }

  Config& c_;
  TripleOrigin origin_;
  int64_t world_;
};

void add_warning_once(Config& config, const std::string& line) {
  if (std::find(config.warnings.begin(), config.warnings.end(), line) == config.warnings.end()) {
    config.warnings.push_back(line);
  }
}

// zero_hpz_partition_size P (HSDP): must divide the world at stages 2 and
// 3, where it shards inside groups of P ranks; stages 0 and 1 have no
// sharded gradients to replicate, so it does nothing there and says so.
void check_hpz_partition_size(Config& config, int world_size) {
  const ZeroConfig& z = config.zero;
  if (z.hpz_partition_size == 1) return;
  const std::string where = file_origin(config, "zero_optimization.zero_hpz_partition_size");
  const std::string size = z.hpz_partition_size == kHpzRanksPerHost
                               ? std::string("ranks per host")
                               : std::to_string(z.hpz_partition_size);
  if (z.stage < 2) {
    add_warning_once(config, fmt::format("{}: 'zero_optimization.zero_hpz_partition_size: {}' "
                                         "(HSDP) applies to ZeRO stages 2 and 3 only; it has no "
                                         "effect at stage {}",
                                         where, size, z.stage));
    return;
  }
  // The ranks per host are the launcher's: the Accelerator checks them.
  if (z.hpz_partition_size == kHpzRanksPerHost) return;
  if (world_size % z.hpz_partition_size != 0) {
    TANDEM_THROW(UsageError,
                 "{}: zero_optimization.zero_hpz_partition_size is {}, which does not divide "
                 "the world size {}: HSDP shards inside groups of that many ranks and "
                 "replicates across the groups. Set it to a divisor of {} (the ranks of one "
                 "host, usually), or to 1 for plain ZeRO",
                 where, z.hpz_partition_size, world_size, world_size);
  }
  if (z.stage == 2) {
    add_warning_once(config, fmt::format("{}: 'zero_optimization.zero_hpz_partition_size: {}' "
                                         "at stage 2 shards gradients and optimizer state "
                                         "inside groups of {} ranks and replicates across them "
                                         "(FSDP's HYBRID_SHARD_ZERO2); DeepSpeed applies hpZ "
                                         "at stage 3 only",
                                         where, z.hpz_partition_size, z.hpz_partition_size));
  }
}

void check_overrides(const ConfigOverrides& o) {
  if (o.gradient_accumulation_steps && *o.gradient_accumulation_steps < 1) {
    TANDEM_THROW(UsageError, "gradient_accumulation_steps override is {}; pass a value >= 1",
                 *o.gradient_accumulation_steps);
  }
  if (o.train_micro_batch_size_per_gpu && *o.train_micro_batch_size_per_gpu < 1) {
    TANDEM_THROW(UsageError, "train_micro_batch_size_per_gpu override is {}; pass a value >= 1",
                 *o.train_micro_batch_size_per_gpu);
  }
  if (o.gradient_clipping && !(std::isfinite(*o.gradient_clipping) && *o.gradient_clipping >= 0)) {
    TANDEM_THROW(UsageError,
                 "gradient_clipping override is {}; pass 0 (no clipping) or a positive max norm",
                 *o.gradient_clipping);
  }
  if (o.zero_stage && (*o.zero_stage < 0 || *o.zero_stage > 3)) {
    TANDEM_THROW(UsageError, "zero_stage override is {}; pass 0, 1, 2 or 3", *o.zero_stage);
  }
  if (o.steps_per_print && *o.steps_per_print < 1) {
    TANDEM_THROW(UsageError,
                 "steps_per_print override is {}; pass a number of optimizer steps >= 1 (leave "
                 "it empty for no progress line)",
                 *o.steps_per_print);
  }
}

// A DeepSpeed config's fp16/bf16 block against a precision from the
// environment (TANDEM_MIXED_PRECISION, tandem launch --mixed-precision) or
// code, as Accelerate's DeepSpeedPlugin treats ACCELERATE_MIXED_PRECISION and
// Accelerator(mixed_precision=...): the other half type is refused, "no"
// leaves the block on (said, since the run is not in fp32 as asked).
void keep_deepspeed_precision(Config& config, MixedPrecision file_precision,
                              const std::string& origin) {
  const auto block = config.key_locations.find(kDeepSpeedPrecisionKey);
  // torch_autocast without a dtype: the device decides (fp16 on CUDA).
  if (block == config.key_locations.end() || file_precision == MixedPrecision::kNo ||
      config.mixed_precision == file_precision || config.autocast_device_default) {
    return;
  }
  if (config.mixed_precision != MixedPrecision::kNo) {
    TANDEM_THROW(UsageError,
                 "mixed_precision {} (from {}) disagrees with the DeepSpeed config, which "
                 "enables {} at {}: DeepSpeed would train in the file's type, and Accelerate "
                 "refuses the same pair. Make them agree: drop the override, or turn the file's "
                 "block off and the other one on",
                 to_string(config.mixed_precision), origin, to_string(file_precision),
                 block->second);
  }
  config.warnings.push_back(fmt::format(
      "mixed_precision no (from {}) leaves the DeepSpeed config's {} at {} on, as Accelerate "
      "does; to train in fp32, turn that block off",
      origin, to_string(file_precision), block->second));
  config.mixed_precision = file_precision;
}

}  // namespace

Config resolve_config(Config config, const ConfigEnv& env, const ConfigOverrides& overrides,
                      int world_size) {
  if (world_size < 1) {
    TANDEM_THROW(UsageError, "world_size {} passed to resolve_config must be at least 1",
                 world_size);
  }
  check_overrides(overrides);
  TripleOrigin origin{file_origin(config, "train_batch_size"),
                      file_origin(config, "train_micro_batch_size_per_gpu"),
                      file_origin(config, "gradient_accumulation_steps")};

  std::string precision_origin = file_origin(config, "mixed_precision");
  const MixedPrecision file_precision = config.mixed_precision;
  if (env.mixed_precision) {
    config.mixed_precision = *env.mixed_precision;
    precision_origin = "TANDEM_MIXED_PRECISION";
  }
  if (env.gradient_accumulation_steps) {
    config.gradient_accumulation_steps = env.gradient_accumulation_steps;
    origin.accumulation = "TANDEM_GRADIENT_ACCUMULATION_STEPS";
  }
  if (env.seed) config.seed = env.seed;
  if (env.zero_stage) {
    config.zero.stage = *env.zero_stage;
    // accelerate launch --use_deepspeed / --zero_stage: a DeepSpeed job.
    if (config.distributed_type != DistributedType::kFsdp) {
      config.distributed_type = DistributedType::kDeepSpeed;
    }
  }
  // Where a value came from, for the warnings below: an environment
  // variable beats the file's key.
  std::map<std::string, std::string> env_origin;
  if (env.offload_optimizer) {
    config.zero.offload_optimizer = *env.offload_optimizer;
    env_origin["zero_optimization.offload_optimizer"] = "TANDEM_OFFLOAD_OPTIMIZER_DEVICE";
  }
  if (env.offload_param) {
    config.zero.offload_param = *env.offload_param;
    env_origin["zero_optimization.offload_param"] = "TANDEM_OFFLOAD_PARAM_DEVICE";
  }
  const auto origin_of = [&](const std::string& path) {
    const auto it = env_origin.find(path);
    return it != env_origin.end() ? it->second : file_origin(config, path);
  };
  if (env.gradient_clipping) config.gradient_clipping = *env.gradient_clipping;

  if (overrides.mixed_precision) {
    config.mixed_precision = *overrides.mixed_precision;
    precision_origin = "code override";
  }
  keep_deepspeed_precision(config, file_precision, precision_origin);
  if (overrides.gradient_accumulation_steps) {
    config.gradient_accumulation_steps = overrides.gradient_accumulation_steps;
    origin.accumulation = "code override";
  }
  if (overrides.train_micro_batch_size_per_gpu) {
    config.train_micro_batch_size_per_gpu = overrides.train_micro_batch_size_per_gpu;
    origin.micro = overrides.train_micro_batch_size_source.empty()
                       ? "code override"
                       : overrides.train_micro_batch_size_source;
  }
  if (overrides.gradient_clipping) config.gradient_clipping = *overrides.gradient_clipping;
  if (overrides.zero_stage) config.zero.stage = *overrides.zero_stage;
  if (overrides.seed) config.seed = overrides.seed;
  if (overrides.wall_clock_breakdown) config.wall_clock_breakdown = *overrides.wall_clock_breakdown;
  if (overrides.steps_per_print) config.steps_per_print = overrides.steps_per_print;
  if (overrides.cuda_graph) config.cuda_graph = *overrides.cuda_graph;
  if (overrides.preemption) config.preemption = *overrides.preemption;

  // use_cpu trains on the CPU whatever the machine has, and the Accelerator
  // refuses fp16 there: say so when the file is checked or launched, not
  // once per worker after the launch.
  if (config.use_cpu && config.mixed_precision == MixedPrecision::kFp16) {
    TANDEM_THROW(UsageError,
                 "{}: mixed_precision fp16 with use_cpu: true ({}): fp16 needs a CUDA device, "
                 "and use_cpu trains on the CPU, where the Accelerator refuses fp16; use "
                 "mixed_precision bf16 (or no) on the CPU, or set use_cpu: false to train on "
                 "GPUs",
                 precision_origin, file_origin(config, "use_cpu"));
  }
  // The launcher's world is the real one; a file's num_processes is a
  // request that the launch may have changed.
  config.num_processes = world_size;
  TripleSolver(config, origin, world_size).solve();

  check_hpz_partition_size(config, world_size);
  if (config.zero.offload_param == OffloadDevice::kCpu && config.zero.stage < 3) {
    add_warning_once(config, fmt::format("{}: 'zero_optimization.offload_param' applies to ZeRO "
                                         "stage 3 only; it has no effect at stage {}",
                                         origin_of("zero_optimization.offload_param"),
                                         config.zero.stage));
  }
  // Stage 0 is DDP: no optimizer shard to offload (the FSDP reader says the
  // same of fsdp_offload_params under NO_SHARD).
  if (config.zero.offload_optimizer == OffloadDevice::kCpu && config.zero.stage == 0) {
    add_warning_once(config, fmt::format("{}: 'zero_optimization.offload_optimizer' applies to "
                                         "ZeRO stages 1-3; at stage 0 (DDP) the optimizer state "
                                         "stays with the model. Set stage to 1 or more to "
                                         "offload it",
                                         origin_of("zero_optimization.offload_optimizer")));
  }
  // The ddp block configures DDP, which is ZeRO stage 0: under stages 1-3
  // the ZeroOptimizer reduces the gradients, with none of it.
  if (config.zero.stage > 0) {
    const DdpConfig plain;
    std::vector<std::string> set;
    if (config.ddp.comm_hook != plain.comm_hook) set.push_back("comm_hook " + config.ddp.comm_hook);
    if (config.ddp.bucket_cap_mb != plain.bucket_cap_mb) set.push_back("bucket_cap_mb");
    if (config.ddp.first_bucket_cap_mb != plain.first_bucket_cap_mb) {
      set.push_back("first_bucket_cap_mb");
    }
    if (config.ddp.static_graph != plain.static_graph) set.push_back("static_graph");
    if (config.ddp.find_unused_parameters != plain.find_unused_parameters) {
      set.push_back("find_unused_parameters");
    }
    if (!set.empty()) {
      add_warning_once(config, fmt::format("{}: the ddp block ({}) configures DDP (ZeRO stage 0); "
                                           "at stage {} the ZeroOptimizer reduces the gradients "
                                           "and it has no effect (ZeRO's sizes are "
                                           "zero_optimization.reduce_bucket_size and "
                                           "allgather_bucket_size)",
                                           file_origin(config, "ddp"), fmt::join(set, ", "),
                                           config.zero.stage));
    }
  }
  // zero3_init (Accelerate's zero3_init_flag) builds Sharded units as
  // shards, which exist at stage 3 only: off below it, as Accelerate turns
  // it off, and said.
  if (config.zero.zero3_init && config.zero.stage < 3) {
    config.zero.zero3_init = false;
    add_warning_once(config, fmt::format("{}: zero3_init (zero3_init_flag) applies to ZeRO stage 3 "
                                         "only; turned off at stage {}",
                                         config.source_path.empty() ? "the config"
                                                                    : config.source_path,
                                         config.zero.stage));
  }
  // The stage-3 limits DeepSpeed takes silently at any stage.
  if (config.zero.stage < 3) {
    for (const char* key : {"stage3_prefetch_bucket_size", "prefetch_bucket_size",
                            "stage3_param_persistence_threshold", "param_persistence_threshold",
                            "stage3_max_live_parameters", "max_live_parameters"}) {
      const std::string path = std::string("zero_optimization.") + key;
      if (config.key_locations.count(path) && !config.auto_keys.count(path)) {
        add_warning_once(config, fmt::format("{}: '{}' applies to ZeRO stage 3 only; it has no "
                                             "effect at stage {}",
                                             file_origin(config, path), path, config.zero.stage));
      }
    }
  }
  return config;
}

}  // namespace tandem
