#include "zero/shard_update.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/core/error.h"
#include "tandem/optim/cpu_adam.h"

namespace tandem::detail {

UpdateRule update_rule_of(torch::optim::Optimizer& optimizer, bool has_factory) {
  // By the options type, which names the update rule whatever object runs
  // it (an Accelerator's prepared optimizer, tandem::CpuAdam).
  const torch::optim::OptimizerOptions* o = &optimizer.defaults();
  TANDEM_CHECK_ARG(dynamic_cast<const torch::optim::LBFGSOptions*>(o) == nullptr,
                   "ZeRO cannot shard LBFGS: it steps the whole parameter vector at once, "
                   "through a closure, so no rank can update its shard alone. Only stage 0 "
                   "(DDP: zero_optimization.stage 0) runs it");
  if (has_factory) return UpdateRule::kCustom;
  if (dynamic_cast<const torch::optim::AdamWOptions*>(o) != nullptr) return UpdateRule::kAdamW;
  if (dynamic_cast<const torch::optim::AdamOptions*>(o) != nullptr) return UpdateRule::kAdam;
  if (dynamic_cast<const torch::optim::SGDOptions*>(o) != nullptr) return UpdateRule::kSgd;
  if (dynamic_cast<const torch::optim::AdagradOptions*>(o) != nullptr) return UpdateRule::kAdagrad;
  if (dynamic_cast<const torch::optim::RMSpropOptions*>(o) != nullptr) return UpdateRule::kRmsprop;
  if (dynamic_cast<const LionOptions*>(o) != nullptr) return UpdateRule::kLion;
  if (dynamic_cast<const LambOptions*>(o) != nullptr) return UpdateRule::kLamb;
  TANDEM_THROW(UsageError,
               "ZeRO shards torch::optim Adam, AdamW, SGD, Adagrad and RMSprop, tandem::CpuAdam, "
               "tandem::Lion and tandem::Lamb; this optimizer is none of them. For another "
               "optimizer that updates each element from its own gradient and state, set "
               "ZeroOptions::shard_optimizer_factory (AcceleratorOptions::"
               "zero_shard_optimizer_factory) to build it over the shards (DeepSpeed's "
               "zero_allow_untested_optimizer); one that needs whole matrices runs only at "
               "stage 0 (DDP: zero_optimization.stage 0)");
}

namespace {

// Adam's or AdamW's options (the same fields, two types).
template <typename Options>
void read_adam(const Options& o, const char* name, UpdateHyper& h) {
  TANDEM_CHECK_ARG(!o.amsgrad(),
                   "ZeRO does not shard {} with amsgrad=true; turn it off, or build it over "
                   "the shards with ZeroOptions::shard_optimizer_factory",
                   name);
  h.lr = o.lr();
  h.weight_decay = o.weight_decay();
  h.beta1 = std::get<0>(o.betas());
  h.beta2 = std::get<1>(o.betas());
  h.eps = o.eps();
}

// The group's options as `Options`; UsageError for a group built with
// another optimizer's options.
template <typename Options>
const Options& options_as(const torch::optim::OptimizerOptions& options) {
  const auto* o = dynamic_cast<const Options*>(&options);
  TANDEM_CHECK_ARG(o != nullptr,
                   "ZeRO: a param group's options are of another optimizer than the "
                   "optimizer's defaults; give every group the same options type");
  return *o;
}

}  // namespace

std::vector<UpdateHyper> read_hyper(torch::optim::Optimizer& optimizer, UpdateRule rule) {
  std::vector<UpdateHyper> out;
  if (rule == UpdateRule::kCustom) return out;
  for (auto& group : optimizer.param_groups()) {
    UpdateHyper h;
    const auto& options = group.options();
    switch (rule) {
      case UpdateRule::kAdam:
        read_adam(options_as<torch::optim::AdamOptions>(options), "Adam", h);
        break;
      case UpdateRule::kAdamW:
        read_adam(options_as<torch::optim::AdamWOptions>(options), "AdamW", h);
        break;
      case UpdateRule::kSgd: {
        const auto& o = options_as<torch::optim::SGDOptions>(options);
        h.lr = o.lr();
        h.weight_decay = o.weight_decay();
        h.momentum = o.momentum();
        h.dampening = o.dampening();
        h.nesterov = o.nesterov();
        break;
      }
      case UpdateRule::kAdagrad: {
        const auto& o = options_as<torch::optim::AdagradOptions>(options);
        h.lr = o.lr();
        h.weight_decay = o.weight_decay();
        h.lr_decay = o.lr_decay();
        // LibTorch's Adagrad fills every parameter's sum from the defaults'
        // value when it is built, whatever its group says; so do the shards.
        h.initial_accumulator_value =
            options_as<torch::optim::AdagradOptions>(optimizer.defaults())
                .initial_accumulator_value();
        h.eps = o.eps();
        break;
      }
      case UpdateRule::kRmsprop: {
        const auto& o = options_as<torch::optim::RMSpropOptions>(options);
        h.lr = o.lr();
        h.weight_decay = o.weight_decay();
        h.alpha = o.alpha();
        h.eps = o.eps();
        h.momentum = o.momentum();
        h.centered = o.centered();
        break;
      }
      case UpdateRule::kLion:
        h.lion = lion_hyper(options_as<LionOptions>(options), "ZeRO");
        break;
      case UpdateRule::kLamb:
        h.lamb = lamb_hyper(options_as<LambOptions>(options), "ZeRO");
        break;
      case UpdateRule::kCustom:
        break;
    }
    out.push_back(h);
  }
  return out;
}

std::vector<std::string> state_names(UpdateRule rule, const std::vector<UpdateHyper>& groups) {
  bool momentum = false;
  bool centered = false;
  for (const auto& h : groups) {
    momentum = momentum || h.momentum != 0.0;
    centered = centered || h.centered;
  }
  switch (rule) {
    case UpdateRule::kAdam:
    case UpdateRule::kAdamW:
    case UpdateRule::kLamb:
      return {"exp_avg", "exp_avg_sq"};
    case UpdateRule::kSgd:
      return momentum ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
    case UpdateRule::kAdagrad:
      return {"sum"};
    case UpdateRule::kRmsprop: {
      std::vector<std::string> names{"square_avg"};
      if (momentum) names.emplace_back("momentum_buffer");
      if (centered) names.emplace_back("grad_avg");
      return names;
    }
    case UpdateRule::kLion:
      return {"exp_avg"};
    case UpdateRule::kCustom:
      return {};
  }
  return {};
}

void check_state_kept(UpdateRule rule, const std::vector<UpdateHyper>& groups,
                      const std::vector<std::string>& kept) {
  for (const auto& name : state_names(rule, groups)) {
    TANDEM_CHECK_ARG(std::find(kept.begin(), kept.end(), name) != kept.end(),
                     "ZeRO: the optimizer's options now need a '{}' state that was not kept "
                     "when the ZeroOptimizer was built (momentum or centered turned on since); "
                     "set them before building it",
                     name);
  }
}

namespace {

void adam_tensor_ops(bool decoupled, const UpdateHyper& h, int64_t step, at::Tensor& p,
                     const at::Tensor& grad_in, at::Tensor& m, at::Tensor& v) {
  // torch::optim::Adam / AdamW, operation for operation.
  at::Tensor grad = grad_in;
  if (decoupled) {
    p.mul_(1 - h.lr * h.weight_decay);
  } else if (h.weight_decay != 0) {
    grad = grad.add(p, h.weight_decay);
  }
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  m.mul_(h.beta1).add_(grad, 1 - h.beta1);
  v.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
  at::Tensor denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(h.eps);
  p.addcdiv_(m, denom, -h.lr / bias_correction1);
}

void adam_shard(bool decoupled, const UpdateHyper& hyper, int64_t step, at::Tensor& master,
                const at::Tensor& grad, std::vector<at::Tensor>& state, int threads) {
  const bool fused = master.is_cpu() && master.scalar_type() == at::kFloat &&
                     grad.scalar_type() == at::kFloat && master.is_contiguous() &&
                     grad.is_contiguous() && state[0].is_contiguous() && state[1].is_contiguous();
  if (!fused) {
    adam_tensor_ops(decoupled, hyper, step, master, grad, state[0], state[1]);
    return;
  }
  AdamHyperparams h;
  h.lr = hyper.lr;
  h.beta1 = hyper.beta1;
  h.beta2 = hyper.beta2;
  h.eps = hyper.eps;
  h.weight_decay = hyper.weight_decay;
  h.decoupled_weight_decay = decoupled;
  cpu_adam_step(master.data_ptr<float>(), grad.data_ptr<float>(), state[0].data_ptr<float>(),
                state[1].data_ptr<float>(), master.numel(), step, h, threads);
}

void sgd_tensor_ops(const UpdateHyper& h, int64_t step, at::Tensor& p, const at::Tensor& grad,
                    std::vector<at::Tensor>& state) {
  at::Tensor d_p = grad;
  if (h.weight_decay != 0) d_p = d_p.add(p, h.weight_decay);
  if (h.momentum != 0) {
    at::Tensor& buf = state.at(0);
    if (step == 1) {
      buf.copy_(d_p);
    } else {
      buf.mul_(h.momentum).add_(d_p, 1 - h.dampening);
    }
    d_p = h.nesterov ? d_p.add(buf, h.momentum) : buf;
  }
  p.add_(d_p, -h.lr);
}

// torch::optim::Adagrad. Its sum starts at initial_accumulator_value
// (filled at the first step: a fresh shard is zeros).
void adagrad_tensor_ops(const UpdateHyper& h, int64_t step, at::Tensor& p, const at::Tensor& grad,
                        at::Tensor& sum) {
  if (step == 1) sum.fill_(h.initial_accumulator_value);
  at::Tensor g = h.weight_decay != 0 ? grad.add(p, h.weight_decay) : grad;
  const double clr = h.lr / (1 + static_cast<double>(step - 1) * h.lr_decay);
  sum.addcmul_(g, g, 1.0);
  p.addcdiv_(g, sum.sqrt().add_(h.eps), -clr);
}

// torch::optim::RMSprop; state is square_avg, then momentum_buffer and
// grad_avg when the optimizer keeps them (state_names(); check_state_kept()
// made sure that this group's are).
void rmsprop_tensor_ops(const UpdateHyper& h, at::Tensor& p, const at::Tensor& grad,
                        std::vector<at::Tensor>& state) {
  at::Tensor g = h.weight_decay != 0 ? grad.add(p, h.weight_decay) : grad;
  at::Tensor& square_avg = state.at(0);
  square_avg.mul_(h.alpha).addcmul_(g, g, 1 - h.alpha);
  at::Tensor avg;
  if (h.centered) {
    at::Tensor& grad_avg = state.back();
    grad_avg.mul_(h.alpha).add_(g, 1 - h.alpha);
    avg = square_avg.addcmul(grad_avg, grad_avg, -1).sqrt_().add_(h.eps);
  } else {
    avg = square_avg.sqrt().add_(h.eps);
  }
  if (h.momentum > 0) {
    at::Tensor& buf = state.at(1);
    buf.mul_(h.momentum).addcdiv_(g, avg);
    p.add_(buf, -h.lr);
  } else {
    p.addcdiv_(g, avg, -h.lr);
  }
}

}  // namespace

void update_shard(UpdateRule rule, const UpdateHyper& hyper, int64_t step, at::Tensor master,
                  const at::Tensor& grad, std::vector<at::Tensor> state, int threads) {
  if (master.numel() == 0) return;
  switch (rule) {
    case UpdateRule::kAdam:
    case UpdateRule::kAdamW:
      adam_shard(rule == UpdateRule::kAdamW, hyper, step, master, grad, state, threads);
      return;
    case UpdateRule::kSgd:
      sgd_tensor_ops(hyper, step, master, grad, state);
      return;
    case UpdateRule::kAdagrad:
      adagrad_tensor_ops(hyper, step, master, grad, state.at(0));
      return;
    case UpdateRule::kRmsprop:
      rmsprop_tensor_ops(hyper, master, grad, state);
      return;
    case UpdateRule::kLion:
      lion_update(master, grad, state.at(0), hyper.lion);
      return;
    case UpdateRule::kLamb:
    case UpdateRule::kCustom:
      break;
  }
  TANDEM_THROW(Error, "internal error: update_shard called for Lamb or a custom optimizer");
}

}  // namespace tandem::detail
