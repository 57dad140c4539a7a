// AcceleratedOptimizer, AcceleratedScheduler and gradient clipping.

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tandem/accelerate/prepared.h"
#include "tandem/amp/unscale.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem {

double clip_gradients(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                      ProcessGroup* sharded_over) {
  TANDEM_CHECK_ARG(max_norm > 0 && std::isfinite(max_norm),
                   "clip_grad_norm: max_norm must be a positive finite number, got {}", max_norm);
  TANDEM_CHECK_ARG(norm_type > 0, "clip_grad_norm: norm_type must be positive (2 for the "
                   "Euclidean norm, inf for the max norm), got {}", norm_type);
  torch::NoGradGuard no_grad;
  // A tied tensor listed twice is one term of the norm, and is scaled once.
  std::vector<at::Tensor> grads;
  for (const auto& p : unique_optimizer_parameters(optimizer)) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  const bool max_norm_type = std::isinf(norm_type);
  at::Tensor local;
  if (grads.empty()) {
    local = at::zeros({}, at::kDouble);
  } else {
    std::vector<at::Tensor> norms;
    norms.reserve(grads.size());
    for (const auto& g : grads) {
      norms.push_back(max_norm_type ? g.abs().max().to(at::kDouble)
                                    : at::norm(g, norm_type).to(at::kDouble));
    }
    at::Tensor stacked = at::stack(norms).cpu();
    local = max_norm_type ? stacked.max() : stacked.pow(norm_type).sum();
  }
  if (sharded_over != nullptr && sharded_over->world_size() > 1) {
    at::Tensor wire = local.reshape({1}).clone();
    sharded_over->all_reduce(wire, max_norm_type ? ReduceOp::kMax : ReduceOp::kSum);
    local = wire.to(at::kDouble).reshape({});
  }
  const double total =
      max_norm_type ? local.item<double>() : std::pow(local.item<double>(), 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (auto& g : grads) g.mul_(coef);
  }
  return total;
}

namespace detail {
namespace {

bool has_low_precision_params(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) return true;
    }
  }
  return false;
}

}  // namespace

OptimizerCore::OptimizerCore(torch::optim::Optimizer& optimizer,
                             std::shared_ptr<GradientState> state,
                             std::shared_ptr<LossScaler> scaler, double gradient_clipping,
                             ProcessGroup* group, ZeroOptimizer* zero)
    : optimizer_(&optimizer),
      state_(std::move(state)),
      scaler_(std::move(scaler)),
      gradient_clipping_(gradient_clipping),
      group_(group),
      zero_(zero) {
  if (zero_ != nullptr) return;  // ZeRO keeps fp32 master shards itself
  // A bf16/fp16 model trains through fp32 copies (DeepSpeed's fp16/bf16
  // optimizers): updates smaller than the low-precision spacing would
  // otherwise round away.
  if (has_low_precision_params(optimizer)) master_ = std::make_unique<MasterWeights>(optimizer);
}

void OptimizerCore::unscale_gradients() {
  if (unscaled_) return;
  const bool scaling = scaler_ != nullptr && scaler_->enabled();
  TANDEM_CHECK_ARG(!scaling || state_->micro_steps_since_step > 0,
                   "unscaling gradients: no backward ran since the last optimizer step, so "
                   "there is nothing to unscale (clip_grad_norm must come after "
                   "accelerator.backward(loss) and before optimizer.step())");
  const double inv_scale = scaling ? scaler_->inv_scale() : 1.0;
  bool found_inf = false;
  if (zero_ != nullptr) {
    // The reduced fp32 gradient shards are what the update reads.
    if (scaling) found_inf = unscale_and_find_inf(zero_->gradient_shards(), inv_scale);
  } else if (master_) {
    master_->copy_grads_to_master(inv_scale);
    if (scaling) {
      std::vector<at::Tensor> grads;
      for (const auto& p : master_->master_params()) grads.push_back(p.grad());
      found_inf = unscale_and_find_inf(grads, 1.0);
    }
  } else if (scaling) {
    std::vector<at::Tensor> grads;
    // A tied tensor listed twice: unscale_and_find_inf() scales it once.
    for (auto& group : optimizer_->param_groups()) {
      for (auto& p : group.params()) grads.push_back(p.grad());
    }
    found_inf = unscale_and_find_inf(grads, inv_scale);
  }
  // DDP's all-reduce spreads an inf/NaN to every rank, but a parameter
  // outside the wrapped model (a loss module's, say) is not all-reduced: one
  // tiny MAX all-reduce makes every rank take the same decision regardless.
  if (scaling && group_ != nullptr && group_->world_size() > 1) {
    found_inf = any_rank_found_inf(*group_, found_inf);
  }
  found_inf_ = found_inf;
  unscaled_ = true;
}

double OptimizerCore::clip(double max_norm, double norm_type) {
  unscale_gradients();
  if (found_inf_) return std::numeric_limits<double>::infinity();
  double norm = 0;
  if (zero_ != nullptr) {
    TANDEM_CHECK_ARG(norm_type == 2.0, "clip_grad_norm under ZeRO clips the L2 norm "
                     "(norm_type 2), got norm_type {}", norm_type);
    norm = zero_->clip_grad_norm(max_norm);
  } else {
    norm = clip_gradients(*optimizer_, max_norm, norm_type, nullptr);
  }
  state_->clipped_this_step = true;
  return norm;
}

void OptimizerCore::step() {
  if (!state_->sync_gradients) {
    state_->last_step_skipped = true;
    return;
  }
  TANDEM_CHECK_ARG(
      state_->accumulation_steps == 1 || state_->micro_steps_since_step > 0,
      "optimizer.step(): gradient_accumulation_steps is {} but no micro-step was begun since the "
      "last step, so tandem cannot tell which backward passes belong together. Call "
      "accelerator.backward(loss) instead of loss.backward(), or wrap the step in "
      "`auto guard = accelerator.accumulate(model);`",
      state_->accumulation_steps);
  // Whatever happens below, the step's per-step flags end with it.
  struct EndStep {
    OptimizerCore* core;
    ~EndStep() { core->end_step(); }
  } end_step_guard{this};
  unscale_gradients();
  const bool skip = found_inf_;
  if (!skip) {
    if (gradient_clipping_ > 0 && !state_->clipped_this_step) {
      if (zero_ != nullptr) {
        zero_->clip_grad_norm(gradient_clipping_);
      } else {
        clip_gradients(*optimizer_, gradient_clipping_, 2.0, nullptr);
      }
    }
    if (zero_ != nullptr) {
      zero_->step();
    } else {
      optimizer_->step();
    }
    if (master_) master_->copy_master_to_model();
    ++state_->optimizer_steps;
  }
  state_->last_step_skipped = skip;
  // The step consumed the accumulated gradients (or discarded them).
  state_->gradients_pending = false;
  // Last: a collapse error leaves the step already accounted for.
  if (scaler_ != nullptr) scaler_->update(skip);
}

void OptimizerCore::end_step() {
  state_->micro_steps_since_step = 0;
  state_->clipped_this_step = false;
  unscaled_ = false;
  found_inf_ = false;
}

void OptimizerCore::zero_grad() {
  if (state_->gradients_pending) return;
  if (zero_ != nullptr) {
    zero_->zero_grad();
    return;
  }
  // In place, so DDP's .grad views of its buckets stay in place (no
  // set-to-None: the next backward would have to re-adopt every gradient).
  torch::NoGradGuard no_grad;
  auto zero = [](at::Tensor& p) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  };
  for (auto& group : optimizer_->param_groups()) {
    for (auto& p : group.params()) zero(p);
  }
  if (master_) {
    for (auto p : master_->model_params()) zero(p);
  }
}

}  // namespace detail

AcceleratedOptimizer::AcceleratedOptimizer(std::shared_ptr<detail::OptimizerCore> core)
    : core_(std::move(core)) {}

void AcceleratedOptimizer::step() { core_->step(); }

void AcceleratedOptimizer::zero_grad() { core_->zero_grad(); }

AcceleratedScheduler::AcceleratedScheduler(std::function<void()> step_fn,
                                           std::shared_ptr<GradientState> state)
    : AcceleratedScheduler(std::make_shared<detail::SchedulerCore>(), std::move(state)) {
  core_->step_fn = std::move(step_fn);
}

AcceleratedScheduler::AcceleratedScheduler(std::shared_ptr<detail::SchedulerCore> core,
                                           std::shared_ptr<GradientState> state)
    : core_(std::move(core)), state_(std::move(state)) {
  core_->seen_optimizer_steps = state_->optimizer_steps;
}

void AcceleratedScheduler::step() {
  if (state_->optimizer_steps == core_->seen_optimizer_steps) return;
  core_->seen_optimizer_steps = state_->optimizer_steps;
  core_->step_fn();
  ++core_->steps;
}

}  // namespace tandem
