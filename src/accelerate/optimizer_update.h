#pragma once
// How a prepared optimizer's update runs: the one place that knows whether
// it is replicated (the optimizer the user passed steps whole gradients on
// every rank, through fp32 master weights for a bf16/fp16 model) or sharded
// (a ZeRO optimizer steps this rank's shard). OptimizerCore calls it and
// never asks which.
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.

#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace tandem {

class AcceleratedOptimizer;
class MasterWeights;
class ZeroOptimizer;

namespace detail {

class OptimizerUpdate {
 public:
  virtual ~OptimizerUpdate() = default;

  // Unscales this step's gradients by `inv_scale` (into the fp32 masters
  // when there are any); with `check_inf`, returns whether any gradient this
  // rank holds is inf/NaN. Runs once per step.
  virtual bool unscale(AcceleratedOptimizer& self, double inv_scale, bool check_inf) = 0;
  // Clips the gradients to a global `norm_type` norm of at most `max_norm`;
  // returns the norm before clipping.
  virtual double clip(AcceleratedOptimizer& self, double max_norm, double norm_type) = 0;
  // UsageError before anything changes when the update cannot take `closure`.
  virtual void check_closure(const torch::optim::Optimizer::LossClosure& closure) const = 0;
  // The update itself. `step_wrapped` steps the optimizer the user passed
  // (holding the live groups) and returns its loss.
  using StepWrapped = std::function<at::Tensor(torch::optim::Optimizer::LossClosure)>;
  virtual at::Tensor apply(torch::optim::Optimizer::LossClosure closure,
                           const StepWrapped& step_wrapped) = 0;
  // Zeroes the gradients in place.
  virtual void zero_grad(AcceleratedOptimizer& self) = 0;

  // The fp32 masters of a replicated bf16/fp16 model (checkpoints save them).
  virtual const MasterWeights* master_weights() const { return nullptr; }
  // The ZeRO optimizer of a sharded update.
  virtual ZeroOptimizer* zero() const { return nullptr; }
};

// Steps the optimizer the user passed; makes fp32 masters when `self`'s
// parameters are bf16/fp16. Call after `self` adopted the live groups.
std::unique_ptr<OptimizerUpdate> make_replicated_update(AcceleratedOptimizer& self);
// Steps `zero`, which keeps its own fp32 master shards.
std::unique_ptr<OptimizerUpdate> make_sharded_update(std::shared_ptr<ZeroOptimizer> zero);

}  // namespace detail
}  // namespace tandem
