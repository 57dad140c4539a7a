#pragma once
// The ways to hold a prepared model (model_strategy.h), for StrategyFactory
// to build: each constructor takes what the factory decoded from the config
// once. Private to the Accelerator. Collective: DDP and ZeRO broadcast rank
// 0's values.

#include <memory>

#include "accelerate/model_strategy.h"
#include "tandem/parallel/ddp.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem {

class ProcessGroup;

namespace detail {

class StepController;

// HSDP's groups: each rank's shard group of `partition_size` ranks and its
// replicate group (null when there is one shard group). All null/1 when the
// config does not ask for HSDP.
struct HybridGroups {
  std::shared_ptr<ProcessGroup> shard;
  std::shared_ptr<ProcessGroup> replicate;
  int partition_size = 1;
  bool enabled() const { return shard != nullptr; }
};

// What every strategy is built over.
struct ModelStrategyParts {
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<ProcessGroup> group;  // the world
  std::shared_ptr<StepController> controller;
};

// Whole on every rank: alone on one process, or wrapped in DDP (`ddp`'s
// options) on several.
std::shared_ptr<ModelStrategy> make_replicated_model(const ModelStrategyParts& parts,
                                                     const DDPOptions& ddp);
// Sharded over the world with the ZeroOptimizer `options` describe, built
// when its optimizer is prepared.
std::shared_ptr<ModelStrategy> make_sharded_model(const ModelStrategyParts& parts,
                                                  const ZeroOptions& options);
// Sharded inside `hybrid`'s shard groups, replicated across them.
std::shared_ptr<ModelStrategy> make_hybrid_sharded_model(const ModelStrategyParts& parts,
                                                         const ZeroOptions& options,
                                                         const HybridGroups& hybrid);

}  // namespace detail
}  // namespace tandem
