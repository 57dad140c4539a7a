#pragma once
// How one prepared model is held across ranks: replicated (alone on one
// process, or wrapped in DDP), sharded together with its optimizer (ZeRO
// 1-3), or sharded inside groups of ranks and replicated across them (HSDP).
// StrategyFactory (strategy_factory.h) picks the subclass once per run from
// the config; after that the Accelerator, its checkpoint and weights code
// ask the strategy questions (is it partitioned? does saving gather the
// parameters? can its replicas be averaged?) and never its stage. A new way
// to hold a model is one more subclass and a line in the factory.
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.
// Collective methods must be called on every rank.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "accelerate/checkpoint_layout.h"
#include "accelerate/optimizer_update.h"
#include "tandem/checkpoint/module_weights.h"

namespace tandem {

class CheckpointReader;
class DistributedDataParallel;
class ZeroOptimizer;

namespace detail {

// What checkpoints record about how a model was held (meta.json's
// "strategy", "zero_stage" and "hpz_partition_size"): the strategy's name
// ("single", "ddp", "zero" or "hsdp"), the ZeRO stage (0 when not sharded)
// and, for HSDP, the ranks of one shard group (1 otherwise).
struct StrategyRecord {
  const char* name = "single";
  int zero_stage = 0;
  int hpz_partition_size = 1;
};

// The calls that only make sense when a model's parameters are partitioned
// across ranks (ZeRO, HSDP): ModelStrategy::partitioned() returns it, or
// null for a replicated model. Until the model's optimizer is prepared
// nothing is partitioned yet: the lists are empty and the calls do nothing.
class PartitionedParameters {
 public:
  virtual ~PartitionedParameters() = default;

  // The ZeRO optimizer that shards the model, once an optimizer over it was
  // prepared (null before).
  virtual std::shared_ptr<ZeroOptimizer> zero() const = 0;

  // Whether each rank holds only a shard of the parameter values themselves
  // (ZeRO-3), so that writing whole weights (save_model) gathers them from
  // the shards; false when every rank keeps whole values and only gradients
  // and optimizer state are partitioned (ZeRO 1 and 2).
  virtual bool gathers_parameters_to_save() const = 0;

  // The parameters whose values are partitioned across ranks, by module
  // path (unique_named_parameters' names), in the order
  // for_each_partitioned_whole() visits them.
  virtual std::vector<std::string> partitioned_names() const = 0;
  // Calls fn(name, whole value) for every partitioned parameter, gathering
  // one unit at a time. Collective.
  virtual void for_each_partitioned_whole(
      const std::function<void(const std::string&, const at::Tensor&)>& fn) = 0;

  // save_state: this rank's fragments of the partitioned parameters, with
  // their fp32 masters and optimizer state, under `prefix`. HSDP's replica
  // groups hold equal shards: only the first writes them, unless
  // `every_replica` (save_on_each_node: each host keeps its own).
  virtual void append_shard_tensors(const std::string& prefix, NamedTensors& out,
                                    bool every_replica) const = 0;
  // load_state: restores what append_shard_tensors() saved (possibly at
  // another world size); with `optimizer_states` false only the weights,
  // keeping the optimizer's moments and step count. `step` is the saved
  // optimizer step count. Collective.
  virtual void restore_shards(const CheckpointReader& checkpoint, const std::string& prefix,
                              bool optimizer_states, int64_t step) = 0;
};

class ModelStrategy {
 public:
  explicit ModelStrategy(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}
  virtual ~ModelStrategy() = default;
  ModelStrategy(const ModelStrategy&) = delete;
  ModelStrategy& operator=(const ModelStrategy&) = delete;

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  // What checkpoints record about it (StrategyRecord).
  virtual StrategyRecord record() const = 0;
  // How it is held, for error messages: "DDP", "ZeRO stage 2", ...
  virtual std::string describe() const = 0;

  // The partitioned-parameters interface, or null when every rank holds
  // the whole model (one process, DDP): then the model's parameters are
  // replicated, so LocalSGD can average them and checkpoints save them from
  // rank 0.
  virtual PartitionedParameters* partitioned() { return nullptr; }
  const PartitionedParameters* partitioned() const {
    return const_cast<ModelStrategy*>(this)->partitioned();
  }

  // The DDP wrapper, when the model has one (DDP over more than one
  // process): checkpoints save its communication hook's state.
  virtual DistributedDataParallel* ddp() { return nullptr; }

  // An optimizer over this model's parameters was prepared: returns the
  // update that steps it. Sharding builds its ZeRO optimizer here and takes
  // one optimizer per model (UsageError for a second). Collective when
  // sharded.
  virtual std::unique_ptr<OptimizerUpdate> attach_optimizer(AcceleratedOptimizer& prepared) = 0;
  // UsageError naming model `index` when it cannot train as prepared (a
  // sharded model with trainable parameters and no optimizer over them).
  virtual void check_ready(std::size_t index) const = 0;

  // Accelerator::no_sync: while a hold is on (they nest), the model's
  // backward communicates nothing and gradients accumulate locally.
  // enter_no_sync() throws UsageError naming model `index` where they
  // cannot (ZeRO stages 2 and 3 partition the gradients);
  // leave_no_sync(sync) hands the switch back to the micro-step's `sync`
  // when the last hold ends. Call outside backward.
  virtual void enter_no_sync(std::size_t index) = 0;
  virtual void leave_no_sync(bool sync) = 0;

  // The Accelerator's wall_clock_breakdown: seconds the training thread has
  // spent blocked on this model's gradient and parameter communication
  // since it was prepared (0 when it communicates nothing), counted where
  // the waits happen. time_communication() turns the measurement on where
  // it costs a clock read per backward (DDP); ZeRO measures always.
  virtual void time_communication() = 0;
  virtual double communication_wait_seconds() const = 0;

  // Accelerator::load_model_weights: pretrained weights into the model (and
  // the fp32 masters of `masters`, the prepared optimizers' when replicated).
  // A failure on any rank throws on every rank. Collective.
  virtual LoadSafetensorsResult load_weights(const std::string& path,
                                             const LoadSafetensorsOptions& options,
                                             const std::vector<const MasterWeights*>& masters) = 0;

 protected:
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace detail
}  // namespace tandem
