// StrategyFactory (strategy_factory.h): the config's zero_optimization and
// ddp blocks, decoded once into the strategy each prepared model gets.

#include "accelerate/strategy_factory.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/comm/mesh.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

DDPOptions ddp_options(const DdpConfig& config) {
  DDPOptions ddp;
  ddp.bucket_cap_mb = config.bucket_cap_mb;
  ddp.first_bucket_cap_mb = config.first_bucket_cap_mb;
  ddp.find_unused_parameters = config.find_unused_parameters;
  ddp.broadcast_buffers = config.broadcast_buffers;
  ddp.cache_cpu_allocations = config.cache_cpu_allocations;
  ddp.static_graph = config.static_graph;
  ddp.comm_hook = config.comm_hook == "bf16"       ? CommHook::kBf16Compress
                  : config.comm_hook == "fp16"     ? CommHook::kFp16Compress
                  : config.comm_hook == "powersgd" ? CommHook::kPowerSGD
                                                   : CommHook::kAverage;
  const PowerSGDConfig& p = config.powersgd;
  ddp.powersgd.matrix_approximation_rank = p.matrix_approximation_rank;
  ddp.powersgd.start_powerSGD_iter = p.start_powerSGD_iter;
  ddp.powersgd.min_compression_rate = p.min_compression_rate;
  ddp.powersgd.use_error_feedback = p.use_error_feedback;
  ddp.powersgd.warm_start = p.warm_start;
  ddp.powersgd.orthogonalization_epsilon = p.orthogonalization_epsilon;
  ddp.powersgd.random_seed = p.random_seed;
  return ddp;
}

// The ZeroOptimizer's options for the config's stage 1-3; empty for 0.
std::optional<ZeroOptions> zero_options(const ZeroConfig& zero) {
  if (zero.stage == 0) return std::nullopt;
  ZeroOptions options;
  options.stage = zero.stage;
  options.reduce_bucket_size = zero.reduce_bucket_size;
  options.offload_optimizer = zero.offload_optimizer == OffloadDevice::kCpu;
  // Below stage 3 there are no parameter shards to offload: the config
  // warned that the key does nothing there, and so it does nothing.
  options.offload_param = zero.offload_param == OffloadDevice::kCpu && zero.stage == 3;
  options.pin_memory = zero.offload_pin_memory;
  options.pin_param_memory = zero.offload_param_pin_memory;
  options.prefetch_bucket_size = zero.stage3_prefetch_bucket_size;
  options.max_live_parameters = zero.stage3_max_live_parameters;
  options.param_persistence_threshold = zero.stage3_param_persistence_threshold;
  options.allgather_bucket_size = zero.allgather_bucket_size;
  options.reduce_scatter = zero.reduce_scatter;
  options.overlap_comm = zero.overlap_comm;
  if (zero.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" && !zero.auto_wrap_layer_types.empty()) {
    options.auto_wrap.policy = AutoWrapOptions::kTransformerLayer;
    options.auto_wrap.layer_types = zero.auto_wrap_layer_types;
  } else if (zero.auto_wrap_policy == "SIZE_BASED_WRAP" && zero.auto_wrap_min_num_params > 0) {
    // Accelerate wraps nothing for a size of 0 (its default).
    options.auto_wrap.policy = AutoWrapOptions::kSize;
    options.auto_wrap.min_num_params = zero.auto_wrap_min_num_params;
  }
  return options;
}

// HSDP's groups for the config's zero_hpz_partition_size over `world`.
// Collective when HSDP is on (it splits `world`); nothing to do for stages
// 0 and 1 or a size of 1.
HybridGroups make_hybrid_groups(const ZeroConfig& zero, const std::shared_ptr<ProcessGroup>& world,
                                int local_world_size) {
  HybridGroups out;
  if (zero.stage < 2 || zero.hpz_partition_size == 1) return out;
  const int w = world->world_size();
  const bool per_host = zero.hpz_partition_size == kHpzRanksPerHost;
  const int p = per_host ? local_world_size : zero.hpz_partition_size;
  TANDEM_CHECK_ARG(p >= 1 && w % p == 0,
                   "[rank {}/{}] {} shards inside groups of {} rank(s), which does not divide "
                   "the {} rank(s) of this run. {}",
                   world->rank(), w,
                   per_host ? "fsdp_sharding_strategy HYBRID_SHARD (ranks per host)"
                            : "zero_optimization.zero_hpz_partition_size",
                   p, w,
                   per_host ? "Launch the same number of processes on every host"
                            : "Set it to a divisor of the world size (the ranks of one host, "
                              "usually), or to 1 for plain ZeRO");
  out.partition_size = p;
  if (p == w) {
    out.shard = world;  // one shard group: nothing to replicate across
    return out;
  }
  // Row-major: shard group g holds ranks [g * p, (g + 1) * p), one host's
  // when p is the ranks per host.
  ProcessMesh mesh(world, {w / p, p}, {"replica", "shard"});
  out.shard = mesh.group("shard");
  out.replicate = mesh.group("replica");
  return out;
}

}  // namespace

StrategyFactory::StrategyFactory(const Config& config, const std::optional<DDPOptions>& ddp,
                                 std::shared_ptr<ProcessGroup> world, int local_world_size,
                                 ZeroOptions::ShardOptimizerFactory shard_optimizer_factory,
                                 const std::optional<AutoWrapOptions>& auto_wrap)
    : world_(std::move(world)),
      ddp_(ddp ? *ddp : ddp_options(config.ddp)),
      zero_(zero_options(config.zero)),
      zero3_init_(config.zero.stage == 3 && config.zero.zero3_init),
      hybrid_(make_hybrid_groups(config.zero, world_, local_world_size)) {
  if (zero_) zero_->shard_optimizer_factory = std::move(shard_optimizer_factory);
  if (zero_ && auto_wrap) zero_->auto_wrap = *auto_wrap;
}

std::shared_ptr<ModelStrategy> StrategyFactory::make(
    std::shared_ptr<torch::nn::Module> module, std::shared_ptr<StepController> controller) const {
  ModelStrategyParts parts;
  parts.module = std::move(module);
  parts.group = world_;
  parts.controller = std::move(controller);
  if (!zero_) return make_replicated_model(parts, ddp_);
  if (hybrid_.enabled()) return make_hybrid_sharded_model(parts, *zero_, hybrid_);
  return make_sharded_model(parts, *zero_);
}

zero::Init StrategyFactory::zero_init(c10::Device device) const {
  if (!zero3_init_) return zero::Init::disabled();
  // Under HSDP the units are cut for the shard group they are sharded over.
  const ProcessGroup& group = hybrid_.enabled() ? *hybrid_.shard : *world_;
  return zero::Init(group, zero_->param_persistence_threshold, device);
}

// Accelerate refuses "auto" sizes it cannot fill; tandem keeps its defaults
// and says so.
void StrategyFactory::warn_about_config(const Config& config) const {
  if (zero_ && zero_->stage == 3 && config.zero.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" &&
      config.zero.auto_wrap_layer_types.empty() &&
      zero_->auto_wrap.policy == AutoWrapOptions::kNone) {
    log_warn("fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP without "
             "fsdp_transformer_layer_cls_to_wrap takes a Python model's _no_split_modules, "
             "which a C++ model has not: no unit is chosen by policy. Name the layer types "
             "there (LibTorch type names, e.g. BlockImpl or Block) or in "
             "AcceleratorOptions::zero_auto_wrap");
  }
  if (!zero_) return;  // the sizes are ZeRO's
  const int64_t values[] = {config.zero.reduce_bucket_size, config.zero.stage3_prefetch_bucket_size,
                            config.zero.stage3_param_persistence_threshold};
  // DeepSpeed's short names stand for the same keys.
  const char* short_keys[] = {"zero_optimization.reduce_bucket_size",
                              "zero_optimization.prefetch_bucket_size",
                              "zero_optimization.param_persistence_threshold"};
  std::vector<std::string> unfilled;
  std::vector<std::string> defaults;
  for (std::size_t i = 0; i < hidden_size_auto_keys().size(); ++i) {
    const std::string& key = hidden_size_auto_keys()[i];
    if (!config.auto_keys.count(key) && !config.auto_keys.count(short_keys[i])) continue;
    unfilled.push_back(key);
    defaults.push_back(fmt::format("{}={}", key.substr(key.find('.') + 1), values[i]));
  }
  if (unfilled.empty()) return;
  log_warn("{}: {} {} \"auto\", which Accelerate fills from model.config.hidden_size, and a C++ "
           "model has no config: tandem keeps its defaults {}. Set AcceleratorOptions::hidden_size "
           "to fill them as Accelerate does, or write numbers in the config",
           config.source_path.empty() ? "the config" : config.source_path,
           fmt::join(unfilled, ", "), unfilled.size() == 1 ? "is" : "are",
           fmt::join(defaults, ", "));
}

}  // namespace tandem::detail
