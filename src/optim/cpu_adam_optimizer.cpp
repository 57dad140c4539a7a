// CpuAdam: torch::optim::Adam / AdamW's bookkeeping (param groups, per-param
// state, archives) around cpu_adam_step().

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/string_utils.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include "core/torch_internals.h"
#include "tandem/core/error.h"
#include "tandem/core/torch_types.h"
#include "tandem/optim/cpu_adam.h"

namespace tandem {
namespace {

using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

template <typename Options>
AdamHyperparams hyperparams_of(const Options& o, bool decoupled, size_t group) {
  TANDEM_CHECK_ARG(!o.amsgrad(),
                   "CpuAdam: param group {} asks for amsgrad, which CpuAdam does not implement. "
                   "Set amsgrad(false), or use torch::optim::{} for this model.",
                   group, decoupled ? "AdamW" : "Adam");
  AdamHyperparams h;
  h.lr = o.lr();
  h.beta1 = std::get<0>(o.betas());
  h.beta2 = std::get<1>(o.betas());
  h.eps = o.eps();
  h.weight_decay = o.weight_decay();
  h.decoupled_weight_decay = decoupled;
  TANDEM_CHECK_ARG(h.lr >= 0 && h.eps >= 0 && h.weight_decay >= 0 && h.beta1 >= 0 &&
                       h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1,
                   "CpuAdam: param group {} has invalid options (lr {}, betas ({}, {}), eps {}, "
                   "weight_decay {}): lr, eps and weight_decay must be >= 0, betas in [0, 1)",
                   group, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay);
  return h;
}

// The group's options as Adam (or AdamW) hyperparameters. A group added with
// the other optimizer's options is refused rather than silently converted.
AdamHyperparams group_hyperparams(const torch::optim::OptimizerOptions& options, bool decoupled,
                                  size_t group) {
  if (decoupled) {
    const auto* o = dynamic_cast<const AdamWOptions*>(&options);
    TANDEM_CHECK_ARG(o != nullptr,
                     "CpuAdam: param group {} does not have AdamWOptions, but this CpuAdam was "
                     "built as AdamW. Give every group the same options type.",
                     group);
    return hyperparams_of(*o, true, group);
  }
  const auto* o = dynamic_cast<const AdamOptions*>(&options);
  TANDEM_CHECK_ARG(o != nullptr,
                   "CpuAdam: param group {} does not have AdamOptions, but this CpuAdam was built "
                   "as Adam. Give every group the same options type.",
                   group);
  return hyperparams_of(*o, false, group);
}

void check_cpu_float_contiguous(const torch::Tensor& t, const char* what, size_t group,
                                size_t index) {
  TANDEM_CHECK_ARG(!t.is_sparse(),
                   "CpuAdam: the {} of parameter {} in param group {} is sparse; CpuAdam (like "
                   "torch::optim::Adam) needs dense gradients.",
                   what, index, group);
  TANDEM_CHECK_ARG(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
                   "CpuAdam: the {} of parameter {} in param group {} is a {}{} tensor on {}; "
                   "CpuAdam steps CPU float32 contiguous tensors only. Keep fp32 master weights "
                   "on the CPU for it, or use torch::optim::Adam/AdamW for this parameter.",
                   what, index, group, t.is_contiguous() ? "" : "non-contiguous ",
                   c10::toString(t.scalar_type()), t.device().str());
}

// One parameter's update; State is AdamParamState or AdamWParamState (the
// same fields, two types so that archives match torch's).
template <typename State>
void step_param(torch::Tensor& p, const AdamHyperparams& h, int threads, size_t group,
                size_t index,
                ska::flat_hash_map<compat::OptimizerStateKey,
                                  std::unique_ptr<torch::optim::OptimizerParamState>>&
                    states) {
  check_cpu_float_contiguous(p, "value", group, index);
  torch::Tensor grad = p.grad();
  TANDEM_CHECK_ARG(!grad.is_sparse(),
                   "CpuAdam: parameter {} in param group {} has a sparse gradient; CpuAdam (like "
                   "torch::optim::Adam) needs dense gradients.",
                   index, group);
  // A strided gradient (e.g. from expand) is read through a contiguous copy.
  grad = grad.contiguous();
  check_cpu_float_contiguous(grad, "gradient", group, index);
  TANDEM_CHECK_ARG(grad.numel() == p.numel(),
                   "CpuAdam: parameter {} in param group {} has {} elements but its gradient {}",
                   index, group, p.numel(), grad.numel());

  const auto key = compat::optimizer_state_key(p);
  auto it = states.find(key);
  if (it == states.end()) {
    auto fresh = std::make_unique<State>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
    it = states.emplace(key, std::move(fresh)).first;
  }
  auto& state = static_cast<State&>(*it->second);
  for (const torch::Tensor* moment : {&state.exp_avg(), &state.exp_avg_sq()}) {
    check_cpu_float_contiguous(*moment, "optimizer state", group, index);
    TANDEM_CHECK_ARG(moment->numel() == p.numel(),
                     "CpuAdam: the optimizer state of parameter {} in param group {} has {} "
                     "elements, the parameter {}: was a checkpoint loaded into another model?",
                     index, group, moment->numel(), p.numel());
  }
  torch::Tensor& exp_avg = state.exp_avg();
  torch::Tensor& exp_avg_sq = state.exp_avg_sq();
  state.step(state.step() + 1);
  cpu_adam_step(p.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                exp_avg_sq.data_ptr<float>(), p.numel(), state.step(), h, threads);
  // What torch's in-place ops do, so autograd notices tensors it saved.
  internals::mark_modified_in_place(p);
  internals::mark_modified_in_place(exp_avg);
  internals::mark_modified_in_place(exp_avg_sq);
}

}  // namespace

CpuAdam::CpuAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                 torch::optim::AdamOptions defaults, int threads)
    : Optimizer(std::move(param_groups), std::make_unique<AdamOptions>(defaults)),
      decoupled_(false),
      threads_(threads) {
  hyperparams_of(defaults, false, 0);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    group_hyperparams(param_groups_[g].options(), decoupled_, g);
  }
}

CpuAdam::CpuAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults,
                 int threads)
    : CpuAdam(std::vector<torch::optim::OptimizerParamGroup>{
                  torch::optim::OptimizerParamGroup(std::move(params))},
              defaults, threads) {}

CpuAdam::CpuAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                 torch::optim::AdamWOptions defaults, int threads)
    : Optimizer(std::move(param_groups), std::make_unique<AdamWOptions>(defaults)),
      decoupled_(true),
      threads_(threads) {
  hyperparams_of(defaults, true, 0);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    group_hyperparams(param_groups_[g].options(), decoupled_, g);
  }
}

CpuAdam::CpuAdam(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults,
                 int threads)
    : CpuAdam(std::vector<torch::optim::OptimizerParamGroup>{
                  torch::optim::OptimizerParamGroup(std::move(params))},
              defaults, threads) {}

torch::Tensor CpuAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    auto& group = param_groups_[g];
    const AdamHyperparams h = group_hyperparams(group.options(), decoupled_, g);
    for (size_t i = 0; i < group.params().size(); ++i) {
      torch::Tensor& p = group.params()[i];
      if (!p.grad().defined()) continue;
      if (decoupled_) {
        step_param<AdamWParamState>(p, h, threads_, g, i, state_);
      } else {
        step_param<AdamParamState>(p, h, threads_, g, i, state_);
      }
    }
  }
  return loss;
}

void CpuAdam::save(torch::serialize::OutputArchive& archive) const {
  if (decoupled_) {
    torch::optim::serialize<AdamWParamState, AdamWOptions>(archive, *this);
  } else {
    torch::optim::serialize<AdamParamState, AdamOptions>(archive, *this);
  }
}

void CpuAdam::load(torch::serialize::InputArchive& archive) {
  if (decoupled_) {
    torch::optim::serialize<AdamWParamState, AdamWOptions>(archive, *this);
  } else {
    torch::optim::serialize<AdamParamState, AdamOptions>(archive, *this);
  }
}

}  // namespace tandem
