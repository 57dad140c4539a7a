#pragma once
// The element math of Lion and Lamb (DeepSpeed's definitions; see
// tandem/optim/lion.h and lamb.h), shared by those optimizers, which step
// whole parameters, and ZeRO, which steps slices of its shards.

#include <cstdint>

#include <ATen/core/Tensor.h>

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

}  // namespace tandem::detail
