// AcceleratedOptimizer, AcceleratedScheduler and gradient clipping.


#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tandem/accelerate/prepared.h"

#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "accelerate/wall_clock_timer.h"
#include "optim/fused_adam.h"
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
  // torch clamps the coefficient at 1: a NaN norm makes every gradient NaN
  // (the step is then visibly broken, or skipped by a loss scaler), never a
  // step with the gradients unclipped.
  if (!(coef >= 1.0)) {
    for (auto& g : grads) g.mul_(coef);
  }
  return total;
}

namespace detail {
namespace {

// NaN for options without a learning rate (a custom optimizer's).
double learning_rate(const torch::optim::OptimizerParamGroup& group) {
  if (!group.has_options()) return std::numeric_limits<double>::quiet_NaN();
  try {
    return group.options().get_lr();
  } catch (const c10::Error&) {
    return std::numeric_limits<double>::quiet_NaN();
  }
}

// Swaps the live param groups and state between two optimizers for a scope.
class SwapGroups {
 public:
  SwapGroups(torch::optim::Optimizer& a, torch::optim::Optimizer& b) : a_(a), b_(b) { swap(); }
  ~SwapGroups() { swap(); }
  SwapGroups(const SwapGroups&) = delete;
  SwapGroups& operator=(const SwapGroups&) = delete;

 private:
  void swap() {
    a_.param_groups().swap(b_.param_groups());
    a_.state().swap(b_.state());
  }
  torch::optim::Optimizer& a_;
  torch::optim::Optimizer& b_;
};

}  // namespace

OptimizerCore::OptimizerCore(Parts parts)
    : wrapped_(std::move(parts.wrapped)),
      controller_(std::move(parts.controller)),
      scaler_(std::move(parts.scaler)),
      gradient_clipping_(parts.gradient_clipping),
      group_(std::move(parts.group)),
      timer_(std::move(parts.timer)) {
  TANDEM_CHECK_ARG(wrapped_ != nullptr, "Accelerator::prepare_optimizer: the optimizer is null");
  id_ = controller_->add_optimizer();
}

void OptimizerCore::adopt(AcceleratedOptimizer& self) {
  self.param_groups().swap(wrapped_->param_groups());
  self.state().swap(wrapped_->state());
  // The decoy: one parameter with a gradient of ones, in a group per live
  // group (same options, so a scheduler built over the wrapped optimizer
  // still finds its groups and its learning rates can be carried over).
  decoy_ = at::zeros({1}, at::kFloat).requires_grad_(true);
  decoy_.mutable_grad() = at::ones({1}, at::kFloat);
  std::vector<torch::optim::OptimizerParamGroup> decoy_groups;
  for (const auto& group : self.param_groups()) {
    decoy_groups.emplace_back(std::vector<at::Tensor>{}, group.options().clone());
    synced_lr_.push_back(learning_rate(group));
  }
  if (decoy_groups.empty()) {
    decoy_groups.emplace_back(std::vector<at::Tensor>{}, wrapped_->defaults().clone());
  }
  decoy_groups.front().params().push_back(decoy_);
  wrapped_->param_groups() = std::move(decoy_groups);
}

void OptimizerCore::check_wrapped(AcceleratedOptimizer& self) {
  auto& groups = wrapped_->param_groups();
  const char* what = nullptr;
  if (groups.empty() || groups.front().params().size() != 1 ||
      !groups.front().params().front().is_same(decoy_)) {
    what = "given other parameters";
  } else if (!wrapped_->state().empty() || decoy_.item<float>() != 0.0f) {
    what = "stepped directly (its step() was called)";
  } else if (!decoy_.grad().defined() || decoy_.grad().item<float>() != 1.0f) {
    what = "zeroed directly (its zero_grad() was called)";
  } else {
    for (std::size_t i = 1; i < groups.size() && what == nullptr; ++i) {
      if (!groups[i].params().empty()) what = "given other parameters";
    }
  }
  TANDEM_CHECK_ARG(what == nullptr,
                   "the optimizer passed to Accelerator::prepare_optimizer() was {} after it was "
                   "prepared. Its parameter groups and state now belong to the "
                   "AcceleratedOptimizer that prepare returned, so that call changed no "
                   "parameter and no gradient. Call step() and zero_grad() on the returned "
                   "optimizer (optimizer->step()): it applies gradient accumulation, loss "
                   "scaling and clipping",
                   what);
  if (grads_after_backward_ > 0 && controller_->gradients_pending()) {
    std::size_t held = 0;
    for (const auto& p : unique_optimizer_parameters(self)) held += p.grad().defined();
    TANDEM_CHECK_ARG(held >= grads_after_backward_,
                     "the gradients accumulated since the last optimizer step were cleared "
                     "outside tandem ({} of {} parameters lost their .grad), so this step would "
                     "miss them. Most likely zero_grad() was called through a "
                     "torch::optim::Optimizer& (LibTorch's zero_grad is not virtual, so the "
                     "prepared optimizer's accumulation rules were bypassed). Call zero_grad() "
                     "on the AcceleratedOptimizer that prepare returned (optimizer->zero_grad())",
                     grads_after_backward_ - held, grads_after_backward_);
  }
  sync_learning_rates(self);
}

void OptimizerCore::note_backward(AcceleratedOptimizer& self) {
  std::size_t held = 0;
  for (const auto& p : unique_optimizer_parameters(self)) held += p.grad().defined();
  grads_after_backward_ = held;
}

bool OptimizerCore::scales_loss() const { return scaler_ != nullptr && scaler_->enabled(); }

double OptimizerCore::loss_scale() const { return scales_loss() ? scaler_->scale() : 1.0; }

bool OptimizerCore::record_graphed_step(AcceleratedOptimizer& self, bool found_inf) {
  // The captured step's gradients live in its graph, not in the parameters'
  // .grad (which it leaves None without accumulation): nothing for
  // check_wrapped to count, until an eager backward notes them again.
  grads_after_backward_ = 0;
  check_wrapped(self);
  const bool skip = found_inf && scales_loss();
  controller_->optimizer_step(id_, /*taken=*/!skip);
  controller_->end_step(id_);
  controller_->zero_grad(id_);
  // As at the end of step(): an unscale the program asked for in between
  // (clip_grad_norm) belonged to this step, which the graph unscaled itself.
  unscaled_ = false;
  found_inf_ = false;
  // Last, as in step(): a collapse error leaves the step accounted for.
  if (scaler_ != nullptr) scaler_->update(skip);
  return skip;
}

void OptimizerCore::sync_learning_rates(AcceleratedOptimizer& self) {
  auto& live = self.param_groups();
  auto& decoys = wrapped_->param_groups();
  // Groups added to the prepared optimizer since: give them decoys too.
  for (std::size_t i = synced_lr_.size(); i < live.size(); ++i) {
    if (i >= decoys.size()) {
      decoys.emplace_back(std::vector<at::Tensor>{}, live[i].options().clone());
    }
    synced_lr_.push_back(learning_rate(live[i]));
  }
  for (std::size_t i = 0; i < live.size() && i < decoys.size(); ++i) {
    const double last = synced_lr_[i];
    if (std::isnan(last)) continue;
    double lr = learning_rate(live[i]);
    const double decoy_lr = learning_rate(decoys[i]);
    // A scheduler (or code) set it on the wrapped optimizer: carry it over.
    // When both changed, the prepared optimizer's value wins.
    if (lr == last && decoy_lr != last) {
      live[i].options().set_lr(decoy_lr);
      lr = decoy_lr;
    } else if (decoy_lr != lr) {
      decoys[i].options().set_lr(lr);
    }
    synced_lr_[i] = lr;
  }
}

void OptimizerCore::with_wrapped(AcceleratedOptimizer& self,
                                 const std::function<void(torch::optim::Optimizer&)>& fn) {
  SwapGroups swap(self, *wrapped_);
  fn(*wrapped_);
}

void OptimizerCore::unscale_gradients(AcceleratedOptimizer& self) {
  if (unscaled_) return;
  const bool scaling = scaler_ != nullptr && scaler_->enabled();
  TANDEM_CHECK_ARG(!scaling || controller_->micro_steps_since_step(id_) > 0,
                   "unscaling gradients: no backward ran since the last optimizer step, so "
                   "there is nothing to unscale (clip_grad_norm must come after "
                   "accelerator.backward(loss) and before optimizer->step())");
  const double inv_scale = scaling ? scaler_->inv_scale() : 1.0;
  bool found_inf = update_->unscale(self, inv_scale, /*check_inf=*/scaling);
  // Each rank checked only what it holds (under ZeRO its gradient shard;
  // under DDP a parameter outside the wrapped model, a loss module's say, is
  // not all-reduced): one tiny MAX all-reduce makes every rank decide alike.
  if (scaling && group_ != nullptr && group_->world_size() > 1) {
    found_inf = any_rank_found_inf(*group_, found_inf);
  }
  found_inf_ = found_inf;
  unscaled_ = true;
}

double OptimizerCore::clip(AcceleratedOptimizer& self, double max_norm, double norm_type) {
  unscale_gradients(self);
  if (found_inf_) return std::numeric_limits<double>::infinity();
  const double norm = update_->clip(self, max_norm, norm_type);
  controller_->note_clipped(id_);
  return norm;
}

void OptimizerCore::clip_value(AcceleratedOptimizer& self, double clip_value) {
  unscale_gradients(self);
  if (found_inf_) return;  // clamping would hide the overflow the step skips on
  update_->clip_value(self, clip_value);
}

at::Tensor OptimizerCore::step(AcceleratedOptimizer& self,
                               torch::optim::Optimizer::LossClosure closure) {
  check_wrapped(self);
  const GradientState& state = controller_->state();
  if (!state.sync_gradients) {
    controller_->step_deferred(id_);
    return {};
  }
  if (timer_) timer_->before_step();
  const int64_t steps_before = state.optimizer_steps;
  TANDEM_CHECK_ARG(
      state.accumulation_steps == 1 || controller_->micro_steps_since_step(id_) > 0,
      "optimizer->step(): gradient_accumulation_steps is {} but no micro-step was begun since "
      "the last step, so tandem cannot tell which backward passes belong together. Call "
      "accelerator.backward(loss) instead of loss.backward(), or wrap the step in "
      "`auto guard = accelerator.accumulate(model);`",
      state.accumulation_steps);
  update_->check_closure(closure);
  // Whatever happens below, the step's per-step flags end with it.
  struct EndStep {
    OptimizerCore* core;
    ~EndStep() {
      core->controller_->end_step(core->id_);
      core->unscaled_ = false;
      core->found_inf_ = false;
    }
  } end_step_guard{this};
  unscale_gradients(self);
  const bool skip = found_inf_;
  at::Tensor loss;
  if (!skip) {
    if (gradient_clipping_ > 0 && !controller_->optimizer(id_).clipped &&
        !update_->clip_on_device(self, gradient_clipping_)) {
      update_->clip(self, gradient_clipping_, 2.0);
    }
    loss = update_->apply(std::move(closure), [&](torch::optim::Optimizer::LossClosure c) {
      at::Tensor out;
      with_wrapped(self, [&](torch::optim::Optimizer& wrapped) {
        // Adam/AdamW on the GPU: one fused launch instead of ~7 per parameter.
        if (c == nullptr && try_fused_adam_step(wrapped)) return;
        out = wrapped.step(c);
      });
      return out;
    });
  }
  // The step consumed the accumulated gradients (or discarded them).
  controller_->optimizer_step(id_, !skip);
  // Last: a collapse error leaves the step already accounted for.
  if (scaler_ != nullptr) scaler_->update(skip);
  if (timer_) {
    const bool scaling = scaler_ != nullptr;
    timer_->after_step(state.optimizer_steps, state.optimizer_steps > steps_before,
                       scaling ? scaler_->skipped_steps() : 0, [&self] {
                         std::vector<double> rates;
                         for (const auto& group : self.param_groups()) {
                           rates.push_back(learning_rate(group));
                         }
                         return rates;
                       },
                       scaling ? scaler_->scale() : 1.0);
  }
  return loss;
}

void OptimizerCore::zero_grad(AcceleratedOptimizer& self) {
  if (timer_) timer_->restart_forward();
  check_wrapped(self);
  if (!controller_->zero_grad(id_)) return;
  update_->zero_grad(self);
}

}  // namespace detail

AcceleratedOptimizer::AcceleratedOptimizer(std::shared_ptr<torch::optim::Optimizer> wrapped,
                                           std::unique_ptr<detail::OptimizerCore> core)
    : torch::optim::Optimizer(std::vector<torch::optim::OptimizerParamGroup>{},
                              wrapped->defaults().clone()),
      core_(std::move(core)) {
  core_->adopt(*this);
}

AcceleratedOptimizer::~AcceleratedOptimizer() = default;

at::Tensor AcceleratedOptimizer::step(LossClosure closure) {
  return core_->step(*this, std::move(closure));
}

void AcceleratedOptimizer::zero_grad() { core_->zero_grad(*this); }

bool AcceleratedOptimizer::step_was_skipped() const {
  return core_->controller().optimizer(core_->id()).last_step_skipped();
}

void AcceleratedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  auto& self = const_cast<AcceleratedOptimizer&>(*this);
  core_->with_wrapped(self, [&](torch::optim::Optimizer& wrapped) { wrapped.save(archive); });
}

void AcceleratedOptimizer::load(torch::serialize::InputArchive& archive) {
  core_->with_wrapped(*this, [&](torch::optim::Optimizer& wrapped) { wrapped.load(archive); });
}

int64_t detail::SchedulerCore::optimizer_steps() const {
  if (optimizer == nullptr) return controller->state().optimizer_steps;
  return controller->optimizer(optimizer->core_->id()).steps;
}

AcceleratedScheduler::AcceleratedScheduler(std::shared_ptr<detail::SchedulerCore> core)
    : core_(std::move(core)) {
  core_->seen_optimizer_steps = core_->optimizer_steps();
}

AcceleratedScheduler::~AcceleratedScheduler() = default;

void AcceleratedScheduler::step() {
  const int64_t steps = core_->optimizer_steps();
  int64_t times = 1;
  if (core_->steps_per_optimizer_step > 0) {
    if (steps == core_->seen_optimizer_steps) return;  // accumulating, or a skipped step
    times = core_->steps_per_optimizer_step;
  }
  core_->seen_optimizer_steps = steps;
  for (int64_t i = 0; i < times; ++i) {
    core_->step_fn();
    ++core_->steps;
  }
  // A scheduler built over the optimizer passed to prepare: its new rates
  // show in the prepared optimizer at once.
  if (core_->optimizer != nullptr) core_->optimizer->core_->sync_learning_rates(*core_->optimizer);
}

int64_t AcceleratedScheduler::steps() const { return core_->steps; }

}  // namespace tandem
