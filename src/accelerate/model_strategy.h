#pragma once
// How one prepared model is held across ranks: the one place that knows
// whether it is replicated (alone on one process, or wrapped in DDP),
// sharded together with its optimizer (ZeRO 1-3), or sharded inside groups
// of ranks and replicated across them (HSDP). The Accelerator, its
// checkpoint and weights code call this interface and never ask which; a
// new way to hold a model is one more subclass and a line in
// make_model_strategy().
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
#include "tandem/config/config.h"
#include "tandem/parallel/ddp.h"
#include "tandem/zero/init.h"

namespace tandem {

class CheckpointReader;
class ProcessGroup;
class ZeroOptimizer;

namespace detail {

class StepController;

class ModelStrategy {
 public:
  explicit ModelStrategy(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}
  virtual ~ModelStrategy() = default;
  ModelStrategy(const ModelStrategy&) = delete;
  ModelStrategy& operator=(const ModelStrategy&) = delete;

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

  // What checkpoints record: "single", "ddp", "zero" or "hsdp", the ZeRO
  // stage (0 when not sharded) and, for HSDP, the ranks of one shard group
  // (1 otherwise).
  virtual const char* name() const = 0;
  virtual int zero_stage() const { return 0; }
  virtual int hpz_partition_size() const { return 1; }
  // The ZeRO optimizer that shards the model, once an optimizer over it was
  // prepared (null otherwise and when not sharded).
  virtual std::shared_ptr<ZeroOptimizer> zero() const { return nullptr; }

  // An optimizer over this model's parameters was prepared: returns the
  // update that steps it. Sharding builds its ZeRO optimizer here and takes
  // one optimizer per model (UsageError for a second). Collective when
  // sharded.
  virtual std::unique_ptr<OptimizerUpdate> attach_optimizer(AcceleratedOptimizer& prepared) = 0;
  // UsageError naming model `index` when it cannot train as prepared (a
  // sharded model with trainable parameters and no optimizer over them).
  virtual void check_ready(std::size_t index) const { (void)index; }

  // Accelerator::no_sync: while a hold is on (they nest), the model's
  // backward communicates nothing and gradients accumulate locally.
  // enter_no_sync() throws UsageError naming model `index` where they
  // cannot (ZeRO stages 2 and 3 partition the gradients);
  // leave_no_sync(sync) hands the switch back to the micro-step's `sync`
  // when the last hold ends. Call outside backward.
  virtual void enter_no_sync(std::size_t index) { (void)index; }
  virtual void leave_no_sync(bool sync) { (void)sync; }

  // The Accelerator's wall_clock_breakdown: seconds the training thread has
  // spent blocked on this model's gradient and parameter communication
  // since it was prepared (0 when it communicates nothing), counted where
  // the waits happen. time_communication() turns the measurement on where
  // it costs a clock read per backward (DDP).
  virtual void time_communication() {}
  virtual double communication_wait_seconds() const { return 0.0; }

  // The parameters whose values are partitioned across ranks, by module
  // path (unique_named_parameters' names), in the order
  // for_each_partitioned_whole() visits them. Empty when replicated.
  virtual std::vector<std::string> partitioned_names() const { return {}; }
  // Calls fn(name, whole value) for every partitioned parameter, gathering
  // one unit at a time. Collective; nothing to do when replicated.
  virtual void for_each_partitioned_whole(
      const std::function<void(const std::string&, const at::Tensor&)>& fn) {
    (void)fn;
  }

  // save_state: this rank's fragments of the partitioned parameters, with
  // their fp32 masters and optimizer state, under `prefix`.
  virtual void append_shard_tensors(const std::string& prefix, NamedTensors& out) const {
    (void)prefix;
    (void)out;
  }
  // load_state: restores what append_shard_tensors() saved (possibly at
  // another world size); with `optimizer_states` false only the weights,
  // keeping the optimizer's moments and step count. `step` is the saved
  // optimizer step count. Collective.
  virtual void restore_shards(const CheckpointReader& checkpoint, const std::string& prefix,
                              bool optimizer_states, int64_t step) {
    (void)checkpoint;
    (void)prefix;
    (void)optimizer_states;
    (void)step;
  }

  // Accelerator::load_model_weights: pretrained weights into the model (and
  // the fp32 masters of `masters`, the prepared optimizers' when replicated).
  // A failure on any rank throws on every rank. Collective.
  virtual LoadSafetensorsResult load_weights(const std::string& path,
                                             const LoadSafetensorsOptions& options,
                                             const std::vector<const MasterWeights*>& masters) = 0;

 protected:
  std::shared_ptr<torch::nn::Module> module_;
};

// HSDP's groups (make_hybrid_groups): each rank's shard group of
// `partition_size` ranks and its replicate group (null when there is one
// shard group). All null/1 when the config does not ask for HSDP.
struct HybridGroups {
  std::shared_ptr<ProcessGroup> shard;
  std::shared_ptr<ProcessGroup> replicate;
  int partition_size = 1;
  bool enabled() const { return shard != nullptr; }
};

// The groups for the config's zero_hpz_partition_size over `world` (0: the
// launcher's `local_world_size` ranks per host): consecutive ranks form a
// shard group, as launchers number ranks host by host. UsageError when the
// size does not divide the world. Collective when HSDP is on (it splits
// `world`); nothing to do for stages 0 and 1 or a size of 1.
HybridGroups make_hybrid_groups(const ZeroConfig& zero, const std::shared_ptr<ProcessGroup>& world,
                                int local_world_size);

// What prepare_model knows when it chooses how to hold a model.
struct ModelStrategyParts {
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<ProcessGroup> group;
  HybridGroups hybrid;  // HSDP's groups when enabled()
  std::shared_ptr<StepController> controller;
  ZeroConfig zero;   // the config's zero_optimization block
  DDPOptions ddp;    // for a replicated model on several processes
};

// Replicated on one process, DDP on several, ZeRO when the config's stage
// is 1-3, or HSDP when `parts.hybrid` is enabled. Collective (DDP and ZeRO
// broadcast rank 0's values).
std::shared_ptr<ModelStrategy> make_model_strategy(ModelStrategyParts parts);

// Whether the models make_model_strategy() chooses for `zero` each take the
// optimizer over them (ZeRO: one optimizer per model, prepared after it);
// otherwise an optimizer stands alone and may span models.
bool binds_optimizers(const ZeroConfig& zero);

// What Accelerator::zero_init() returns: an Init that cuts the units on
// `device` when the models will be sharded at stage 3 with zero3_init, else
// a guard that does nothing. `group` is the group the units are sharded
// over: the world, or under HSDP the shard group.
zero::Init make_zero_init(const ZeroConfig& zero, const ProcessGroup& group, c10::Device device);

}  // namespace detail
}  // namespace tandem
