#pragma once
// StrategyFactory: the one place that reads the config's zero_optimization
// block to decide how the run holds its models. The Accelerator builds it
// once, at construction, and from then on asks it (which strategy for this
// model? do optimizers bind to one model? what does zero_init() do?) and
// asks the strategies it made (model_strategy.h), never the stage.
//
//   config.zero.stage 0              ReplicatedModel (one process, or DDP)
//   stage 1-3                        ShardedModel (ZeRO over the world)
//   stage 2-3, hpz_partition_size>1  HybridShardedModel (HSDP: ZeRO inside
//                                    shard groups, replicated across them)
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.

#include <memory>
#include <optional>

#include <c10/core/Device.h>

#include "accelerate/model_strategies.h"
#include "tandem/config/config.h"
#include "tandem/parallel/ddp.h"
#include "tandem/zero/init.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem::detail {

class StrategyFactory {
 public:
  // Decodes `config` (its zero_optimization and ddp blocks; `ddp` replaces
  // the latter when given, AcceleratorOptions::ddp) for a run over `world`.
  // Under HSDP it splits `world` into the shard and replicate groups
  // (consecutive ranks form a shard group, as launchers number ranks host by
  // host; zero_hpz_partition_size 0 means `local_world_size` ranks): that is
  // collective, so every rank constructs it at the same point. UsageError
  // when the partition size does not divide the world.
  // `shard_optimizer_factory` (may be empty) goes to every ZeroOptimizer
  // (ZeroOptions::shard_optimizer_factory), and `auto_wrap`, when set,
  // replaces the config's policy (ZeroOptions::auto_wrap).
  StrategyFactory(const Config& config, const std::optional<DDPOptions>& ddp,
                  std::shared_ptr<ProcessGroup> world, int local_world_size,
                  ZeroOptions::ShardOptimizerFactory shard_optimizer_factory = {},
                  const std::optional<AutoWrapOptions>& auto_wrap = std::nullopt);

  // How to hold `module`, prepared now: replicated, ZeRO or HSDP.
  // Collective (DDP and ZeRO broadcast rank 0's values).
  std::shared_ptr<ModelStrategy> make(std::shared_ptr<torch::nn::Module> module,
                                      std::shared_ptr<StepController> controller) const;

  // Whether the strategies this factory makes each take the optimizer over
  // them (ZeRO: one optimizer per model, prepared after it); otherwise an
  // optimizer stands alone and may span models.
  bool binds_optimizers() const { return zero_.has_value(); }

  // What Accelerator::zero_init() returns: a zero::Init that cuts the units
  // on `device` for the group they will be sharded over (the world, or
  // under HSDP the shard group) when the models will be sharded at stage 3
  // with zero3_init; else a guard that does nothing.
  zero::Init zero_init(c10::Device device) const;

  // The warnings about the config's ZeRO sizes left "auto" with no hidden
  // size to fill them, and about a transformer-layer wrap policy without
  // layer names (none unless the models will be sharded). Log on the main
  // process only.
  void warn_about_config(const Config& config) const;

 private:
  std::shared_ptr<ProcessGroup> world_;
  DDPOptions ddp_;
  std::optional<ZeroOptions> zero_;  // empty: replicated (stage 0)
  bool zero3_init_ = false;
  HybridGroups hybrid_;
};

}  // namespace tandem::detail
