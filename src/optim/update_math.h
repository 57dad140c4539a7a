#pragma once
// The element math of Lion and Lamb (DeepSpeed's definitions; see
// tandem/optim/lion.h and lamb.h), shared by those optimizers, which step
// whole parameters, and ZeRO, which steps slices of its shards.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "tandem/core/error.h"
#include "tandem/core/torch_types.h"

#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"

namespace tandem::detail {

struct LionHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.0;
};
// The group options `o` as scalars; UsageError (naming `where`) for values
// the update is undefined for.
LionHyper lion_hyper(const LionOptions& o, const char* where);
// One step on `p` in place (any shape; all three alike).
void lion_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& exp_avg, const LionHyper& h);

struct LambHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool bias_correction = true, eps_inside_sqrt = false;
  double max_coeff = 10.0, min_coeff = 0.01;
};
LambHyper lamb_hyper(const LambOptions& o, const char* where);
// First half of a step: updates the moments from `grad` and returns the
// direction u; adds the squares of `p` and of u to *p_squares and
// *u_squares (doubles, so partial sums over shards add up exactly enough).
at::Tensor lamb_direction(const at::Tensor& p, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, const LambHyper& h, double* p_squares,
                          double* u_squares);
// The factor of u in the second half, p <- p - factor * u, from the whole
// parameter's sums of squares at 1-based step `step`.
double lamb_factor(const LambHyper& h, int64_t step, double p_squares, double u_squares);

// The body of Lion's and Lamb's step(): runs `closure` (with grad), then
// calls fn(options, param, state) for every parameter with a dense
// gradient, its State made by fresh(param) at its first step. UsageError
// for a group with other options and for sparse gradients.
template <typename Options, typename State, typename Fresh, typename Fn>
torch::Tensor step_each_param(torch::optim::Optimizer& optimizer, const char* name,
                              const torch::optim::Optimizer::LossClosure& closure, Fresh fresh,
                              Fn fn) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : optimizer.param_groups()) {
    const auto* options = dynamic_cast<const Options*>(&group.options());
    TANDEM_CHECK_ARG(options != nullptr,
                     "{}: a param group has options of another optimizer; give every group "
                     "{}Options",
                     name, name);
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TANDEM_CHECK_ARG(!p.grad().is_sparse(), "{}: sparse gradients are not supported", name);
      auto& slot = optimizer.state()[compat::optimizer_state_key(p)];
      if (!slot) slot = fresh(p);
      fn(*options, p, static_cast<State&>(*slot));
    }
  }
  return loss;
}

}  // namespace tandem::detail
