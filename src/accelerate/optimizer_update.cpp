// The two ways a prepared optimizer's update runs (optimizer_update.h).

#include "accelerate/optimizer_update.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "tandem/accelerate/prepared.h"
#include "tandem/amp/master_weights.h"
#include "tandem/amp/unscale.h"
#include "tandem/core/error.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem::detail {
namespace {

bool has_low_precision_params(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) return true;
    }
  }
  return false;
}

// Every rank steps the whole model with the optimizer the user passed.
class ReplicatedUpdate final : public OptimizerUpdate {
 public:
  explicit ReplicatedUpdate(AcceleratedOptimizer& self) {
    // A bf16/fp16 model trains through fp32 copies (DeepSpeed's fp16/bf16
    // optimizers): updates smaller than the low-precision spacing would
    // otherwise round away.
    if (has_low_precision_params(self)) master_ = std::make_unique<MasterWeights>(self);
  }

  bool unscale(AcceleratedOptimizer& self, double inv_scale, bool check_inf) override {
    if (master_) {
      master_->copy_grads_to_master(inv_scale);
      if (!check_inf) return false;
      std::vector<at::Tensor> grads;
      for (const auto& p : master_->master_params()) grads.push_back(p.grad());
      return unscale_and_find_inf(grads, 1.0);
    }
    if (!check_inf) return false;  // nothing to scale back
    std::vector<at::Tensor> grads;
    // A tied tensor listed twice: unscale_and_find_inf() scales it once.
    for (auto& group : self.param_groups()) {
      for (auto& p : group.params()) grads.push_back(p.grad());
    }
    return unscale_and_find_inf(grads, inv_scale);
  }

  double clip(AcceleratedOptimizer& self, double max_norm, double norm_type) override {
    return clip_gradients(self, max_norm, norm_type, nullptr);
  }

  void check_closure(const torch::optim::Optimizer::LossClosure&) const override {}

  at::Tensor apply(torch::optim::Optimizer::LossClosure closure,
                   const StepWrapped& step_wrapped) override {
    at::Tensor loss = step_wrapped(std::move(closure));
    if (master_) master_->copy_master_to_model();
    return loss;
  }

  void zero_grad(AcceleratedOptimizer& self) override {
    // In place, so DDP's .grad views of its buckets stay in place (no
    // set-to-None: the next backward would have to re-adopt every gradient).
    torch::NoGradGuard no_grad;
    auto zero = [](at::Tensor& p) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    };
    for (auto& group : self.param_groups()) {
      for (auto& p : group.params()) zero(p);
    }
    if (master_) {
      for (auto p : master_->model_params()) zero(p);
    }
  }

  const MasterWeights* master_weights() const override { return master_.get(); }

 private:
  std::unique_ptr<MasterWeights> master_;
};

// ZeRO steps this rank's shard: reduced fp32 gradient shards, fp32 master
// shards and the optimizer state live in the ZeroOptimizer.
class ShardedUpdate final : public OptimizerUpdate {
 public:
  explicit ShardedUpdate(std::shared_ptr<ZeroOptimizer> zero) : zero_(std::move(zero)) {}

  bool unscale(AcceleratedOptimizer&, double inv_scale, bool check_inf) override {
    // The reduced fp32 gradient shards are what the update reads.
    return check_inf && unscale_and_find_inf(zero_->gradient_shards(), inv_scale);
  }

  double clip(AcceleratedOptimizer&, double max_norm, double norm_type) override {
    TANDEM_CHECK_ARG(norm_type == 2.0, "clip_grad_norm under ZeRO clips the L2 norm "
                     "(norm_type 2), got norm_type {}", norm_type);
    return zero_->clip_grad_norm(max_norm);
  }

  void check_closure(const torch::optim::Optimizer::LossClosure& closure) const override {
    TANDEM_CHECK_ARG(closure == nullptr,
                     "optimizer->step(closure): ZeRO steps from the gradients of the last "
                     "backward and takes no closure; call step() without one");
  }

  at::Tensor apply(torch::optim::Optimizer::LossClosure, const StepWrapped&) override {
    zero_->step();
    return {};
  }

  void zero_grad(AcceleratedOptimizer&) override { zero_->zero_grad(); }

  ZeroOptimizer* zero() const override { return zero_.get(); }

 private:
  std::shared_ptr<ZeroOptimizer> zero_;
};

}  // namespace

std::unique_ptr<OptimizerUpdate> make_replicated_update(AcceleratedOptimizer& self) {
  return std::make_unique<ReplicatedUpdate>(self);
}

std::unique_ptr<OptimizerUpdate> make_sharded_update(std::shared_ptr<ZeroOptimizer> zero) {
  return std::make_unique<ShardedUpdate>(std::move(zero));
}

}  // namespace tandem::detail
