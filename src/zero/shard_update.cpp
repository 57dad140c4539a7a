#include "zero/shard_update.h"

#include <cmath>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "tandem/core/error.h"
#include "tandem/optim/cpu_adam.h"

namespace tandem::detail {

UpdateRule update_rule_of(torch::optim::Optimizer& optimizer) {
  // By the options type, which names the update rule whatever object runs
  // it (an Accelerator's prepared optimizer, tandem::CpuAdam).
  const torch::optim::OptimizerOptions* o = &optimizer.defaults();
  if (dynamic_cast<const torch::optim::AdamWOptions*>(o) != nullptr) return UpdateRule::kAdamW;
  if (dynamic_cast<const torch::optim::AdamOptions*>(o) != nullptr) return UpdateRule::kAdam;
  if (dynamic_cast<const torch::optim::SGDOptions*>(o) != nullptr) return UpdateRule::kSgd;
  TANDEM_THROW(UsageError,
               "ZeRO shards torch::optim::Adam, AdamW and SGD (and tandem::CpuAdam); this "
               "optimizer is none of them. Build one of those over the model's parameters "
               "(ZeRO runs tandem's CPU Adam kernel on the shards when offloading), or train "
               "without ZeRO (zero_optimization.stage 0: DDP steps any torch::optim optimizer "
               "on whole parameters)");
}

std::vector<UpdateHyper> read_hyper(torch::optim::Optimizer& optimizer, UpdateRule rule) {
  std::vector<UpdateHyper> out;
  for (auto& group : optimizer.param_groups()) {
    UpdateHyper h;
    auto& options = group.options();
    if (rule == UpdateRule::kAdam) {
      auto& o = static_cast<torch::optim::AdamOptions&>(options);
      TANDEM_CHECK_ARG(!o.amsgrad(), "ZeRO does not shard Adam with amsgrad=true; turn it off");
      h.lr = o.lr();
      h.weight_decay = o.weight_decay();
      h.beta1 = std::get<0>(o.betas());
      h.beta2 = std::get<1>(o.betas());
      h.eps = o.eps();
    } else if (rule == UpdateRule::kAdamW) {
      auto& o = static_cast<torch::optim::AdamWOptions&>(options);
      TANDEM_CHECK_ARG(!o.amsgrad(), "ZeRO does not shard AdamW with amsgrad=true; turn it off");
      h.lr = o.lr();
      h.weight_decay = o.weight_decay();
      h.beta1 = std::get<0>(o.betas());
      h.beta2 = std::get<1>(o.betas());
      h.eps = o.eps();
    } else {
      auto& o = static_cast<torch::optim::SGDOptions&>(options);
      h.lr = o.lr();
      h.weight_decay = o.weight_decay();
      h.momentum = o.momentum();
      h.dampening = o.dampening();
      h.nesterov = o.nesterov();
    }
    out.push_back(h);
  }
  return out;
}

int state_count(UpdateRule rule, const std::vector<UpdateHyper>& groups) {
  if (rule != UpdateRule::kSgd) return 2;
  for (const auto& h : groups) {
    if (h.momentum != 0.0) return 1;
  }
  return 0;
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

}  // namespace

void update_shard(UpdateRule rule, const UpdateHyper& hyper, int64_t step, at::Tensor master,
                  const at::Tensor& grad, std::vector<at::Tensor> state, int threads) {
  if (master.numel() == 0) return;
  if (rule == UpdateRule::kSgd) {
    sgd_tensor_ops(hyper, step, master, grad, state);
    return;
  }
  const bool decoupled = rule == UpdateRule::kAdamW;
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

}  // namespace tandem::detail
