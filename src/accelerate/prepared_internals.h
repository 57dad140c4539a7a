#pragma once
// What the prepared objects share with the Accelerator, private to it: the
// optimizer's loss scaling, master weights and wrapped-optimizer guard, a
// scheduler's state access, a loader's position, and the join hooks.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "accelerate/optimizer_update.h"
#include "core/torch_internals.h"
#include "tandem/amp/loss_scaler.h"
#include "tandem/amp/master_weights.h"

namespace tandem {

class AcceleratedOptimizer;
class ProcessGroup;
class ZeroOptimizer;

namespace detail {

// Refuses (UsageError) a model with units cut by zero::Init when `device` is
// not the host: moving cut units is not supported yet.
void refuse_cut_model_off_host(const torch::nn::Module& model, c10::Device device);

class StepController;
class WallClockTimer;

// The prepared optimizer's machinery. `self` (the AcceleratedOptimizer)
// holds the live param groups and state; `wrapped` (the optimizer the user
// passed) holds a decoy group between steps, and gets the live ones back
// only while its update rule runs.
class OptimizerCore {
 public:
  struct Parts {
    std::shared_ptr<torch::optim::Optimizer> wrapped;
    std::shared_ptr<StepController> controller;
    std::shared_ptr<LossScaler> scaler;
    double gradient_clipping = 0;
    // The ranks that must agree on skipping an overflowing step.
    std::shared_ptr<ProcessGroup> group;
    // wall_clock_breakdown / steps_per_print (null when both are off).
    std::shared_ptr<WallClockTimer> timer;
  };
  explicit OptimizerCore(Parts parts);

  // Takes `self`'s param groups and state from the wrapped optimizer (which
  // gets the decoy).
  void adopt(AcceleratedOptimizer& self);
  // How the update runs (replicated or sharded); set once, after adopt()
  // and before the first step.
  void set_update(std::unique_ptr<OptimizerUpdate> update) { update_ = std::move(update); }

  // Unscales the current step's gradients once (into the fp32 masters when
  // there are any) and records whether any is inf/NaN. Later calls in the
  // same step do nothing.
  void unscale_gradients(AcceleratedOptimizer& self);
  double clip(AcceleratedOptimizer& self, double max_norm, double norm_type);
  // Unscales (once per step), then clamps to [-clip_value, clip_value]
  // unless the step overflowed.
  void clip_value(AcceleratedOptimizer& self, double clip_value);
  at::Tensor step(AcceleratedOptimizer& self, torch::optim::Optimizer::LossClosure closure);
  void zero_grad(AcceleratedOptimizer& self);
  // Runs `fn` on the wrapped optimizer holding the live groups and state.
  void with_wrapped(AcceleratedOptimizer& self,
                    const std::function<void(torch::optim::Optimizer&)>& fn);
  // UsageError when the wrapped optimizer was stepped or zeroed directly, or
  // when gradients being accumulated were cleared outside tandem; carries
  // learning rates set on the wrapped optimizer (a scheduler built over it)
  // over.
  void check_wrapped(AcceleratedOptimizer& self);

  // After Accelerator::backward(): remembers how many parameters hold a
  // gradient, so that check_wrapped() notices them cleared behind tandem's
  // back (LibTorch's zero_grad() is not virtual: called through a
  // torch::optim::Optimizer&, it bypasses the accumulation rules).
  void note_backward(AcceleratedOptimizer& self);

  // The bookkeeping of a step a CUDA graph ran (cuda_graph_step.h): taken,
  // or skipped for an overflow (`found_inf`, read from the device), its
  // gradients counted as zeroed, and the loss scaler updated as an eager
  // step updates it. Returns whether the step was skipped.
  bool record_graphed_step(AcceleratedOptimizer& self, bool found_inf);
  bool scales_loss() const;  // a loss scaler is on (fp16)
  double loss_scale() const;  // the scaler's scale (1 without one)
  bool timed() const { return timer_ != nullptr; }  // wall_clock_breakdown

  // Carries learning rates set on the wrapped optimizer's decoy groups over
  // to the live ones (and live ones to the decoys).
  void sync_learning_rates(AcceleratedOptimizer& self);

  const StepController& controller() const { return *controller_; }
  // This optimizer's id in the controller.
  int id() const { return id_; }
  // The optimizer the user passed (a scheduler may have been built over it).
  const torch::optim::Optimizer& wrapped() const { return *wrapped_; }
  const MasterWeights* master_weights() const { return update_->master_weights(); }
  OptimizerUpdate& update() { return *update_; }

 private:

  std::shared_ptr<torch::optim::Optimizer> wrapped_;
  std::shared_ptr<StepController> controller_;
  int id_ = 0;
  std::shared_ptr<LossScaler> scaler_;
  std::unique_ptr<OptimizerUpdate> update_;
  double gradient_clipping_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<WallClockTimer> timer_;
  bool unscaled_ = false;
  bool found_inf_ = false;
  // Parameters holding a gradient after the last backward (note_backward).
  std::size_t grads_after_backward_ = 0;
  // The decoy parameter left in the wrapped optimizer: a step moves it, a
  // zero_grad clears its gradient of ones.
  at::Tensor decoy_;
  // Per param group: the learning rate both objects held at the last sync
  // (NaN: the options have no learning rate).
  std::vector<double> synced_lr_;
};

// A prepared scheduler's wrapped object, kept alive here.
struct SchedulerCore {
  std::shared_ptr<void> owned;                      // the scheduler
  // What it reads, kept alive; its steps drive the scheduler's (null: none
  // was prepared yet, and the Accelerator's step count drives it).
  std::shared_ptr<AcceleratedOptimizer> optimizer;
  std::shared_ptr<const StepController> controller;
  std::function<void()> step_fn;
  // tandem::LRScheduler's state_dict()/load_state_dict(); empty for LibTorch
  // schedulers, which load_state() restores by replaying step_fn.
  std::function<std::map<std::string, double>()> state_dict;
  std::function<void(const std::map<std::string, double>&)> load_state_dict;
  int64_t seen_optimizer_steps = 0;
  int64_t steps = 0;
  // Wrapped steps per real optimizer step: Accelerate's num_processes
  // (1 with split_batches, and for the config's DeepSpeed schedulers, which
  // DeepSpeed's engine steps once). 0: every step() call steps once
  // (step_scheduler_with_optimizer false).
  int64_t steps_per_optimizer_step = 1;

  // The real steps of `optimizer` (of the Accelerator when it is null).
  int64_t optimizer_steps() const;
};

// The Accelerator's join_uneven_inputs() gradient hooks, removed with it.
struct JoinHooks {
  std::vector<internals::GradHook> hooks;
};

// Where a PreparedLoader is in its data: shared with the Accelerator, which
// saves it in checkpoints and restores it on load_state().
struct LoaderCursor {
  int64_t skip = 0;              // batches the next pass skips
  int64_t position = 0;          // batches handed out in the current pass
  bool in_pass = false;
  int64_t completed_passes = 0;  // the epoch an un-set next pass takes
  bool epoch_set = false;        // set_epoch() was called since the last pass
  int64_t epoch = 0;             // the loader's epoch, mirrored
  int64_t size = 0;              // batches per pass
  int64_t batch_size = 0;        // samples per batch on each rank
  int64_t shards = 0;            // a stream's rank x worker shards; 0: not a stream
  // load_state() rewrote the fields above: apply them to the loader before
  // the next batch.
  bool restore_pending = false;
};

}  // namespace detail
}  // namespace tandem
