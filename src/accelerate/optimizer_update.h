#pragma once
// How a prepared optimizer's update runs: the one place that knows whether
// it is replicated (the optimizer the user passed steps whole gradients on
// every rank, through fp32 master weights for a bf16/fp16 model) or sharded
// (a ZeRO optimizer steps this rank's shard). OptimizerCore calls it and
// never asks which.
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.

#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include "accelerate/checkpoint_layout.h"

namespace tandem {

class AcceleratedOptimizer;
class CheckpointReader;
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
  // The same for the L2 norm without reading it back to the host, where the
  // update can (its gradients all on CUDA); false, having done nothing,
  // otherwise. For the step's own clipping, whose norm nobody reads.
  virtual bool clip_on_device(AcceleratedOptimizer&, double /*max_norm*/) { return false; }
  // Clamps the gradients the update reads to [-clip_value, clip_value].
  virtual void clip_value(AcceleratedOptimizer& self, double clip_value) = 0;
  // UsageError before anything changes when the update cannot take `closure`.
  virtual void check_closure(const torch::optim::Optimizer::LossClosure& closure) const = 0;
  // The update itself. `step_wrapped` steps the optimizer the user passed
  // (holding the live groups) and returns its loss.
  using StepWrapped = std::function<at::Tensor(torch::optim::Optimizer::LossClosure)>;
  virtual at::Tensor apply(torch::optim::Optimizer::LossClosure closure,
                           const StepWrapped& step_wrapped) = 0;
  // Zeroes the gradients in place.
  virtual void zero_grad(AcceleratedOptimizer& self) = 0;

  // The fp32 masters of a replicated bf16/fp16 model (null otherwise).
  virtual const MasterWeights* master_weights() const { return nullptr; }

  // --- Checkpoints. `names` maps every prepared parameter, and every fp32
  // master copy, to its checkpoint name.
  // Names this update's master copies after their parameters.
  virtual void add_master_names(TensorNames& names) const { (void)names; }
  // save_state's metadata for this optimizer: "state_names", "step" and
  // "param_steps".
  virtual void describe_state(AcceleratedOptimizer& self, const TensorNames& names,
                              nlohmann::json& out) const = 0;
  // The tensors rank 0 writes for this optimizer (replicated: its masters
  // and per-parameter state; sharded: none, the model's shards carry them).
  virtual void append_state_tensors(AcceleratedOptimizer& self, const TensorNames& names,
                                    NamedTensors& out) const = 0;
  // load_state: restores what append_state_tensors() wrote; `saved` is
  // this optimizer's metadata entry.
  virtual void restore_state(AcceleratedOptimizer& self, const CheckpointReader& checkpoint,
                             const nlohmann::json& saved, const TensorNames& names) = 0;
};

// Steps the optimizer the user passed; makes fp32 masters when `self`'s
// parameters are bf16/fp16. Call after `self` adopted the live groups.
// `keep_gradients`: zero_grad() zeroes gradients in place (DDP's .grad views
// of its buckets must stay); otherwise it sets them to None, as PyTorch's
// zero_grad() does, so that the next backward adopts its fresh gradients
// instead of adding them into zeroed ones (a kernel per parameter).
std::unique_ptr<OptimizerUpdate> make_replicated_update(AcceleratedOptimizer& self,
                                                        bool keep_gradients);
// Steps `zero`, which keeps its own fp32 master shards.
std::unique_ptr<OptimizerUpdate> make_sharded_update(std::shared_ptr<ZeroOptimizer> zero);

}  // namespace detail
}  // namespace tandem
