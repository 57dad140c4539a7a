#include "optim/update_math.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "tandem/core/error.h"

namespace tandem::detail {

LionHyper lion_hyper(const LionOptions& o, const char* where) {
  LionHyper h{o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay()};
  TANDEM_CHECK_ARG(h.lr >= 0 && h.weight_decay >= 0 && h.beta1 >= 0 && h.beta1 <= 1 &&
                       h.beta2 >= 0 && h.beta2 <= 1,
                   "{}: Lion options lr {}, betas ({}, {}), weight_decay {}: lr and "
                   "weight_decay must be >= 0 and the betas in [0, 1]",
                   where, h.lr, h.beta1, h.beta2, h.weight_decay);
  return h;
}

void lion_update(at::Tensor& p, const at::Tensor& grad, at::Tensor& exp_avg, const LionHyper& h) {
  at::Tensor direction = exp_avg.mul(h.beta1).add_(grad, 1 - h.beta1).sign_();
  if (h.weight_decay > 0) p.mul_(1 - h.lr * h.weight_decay);
  p.add_(direction, -h.lr);
  exp_avg.mul_(h.beta2).add_(grad, 1 - h.beta2);
}

LambHyper lamb_hyper(const LambOptions& o, const char* where) {
  LambHyper h;
  h.lr = o.lr();
  h.beta1 = std::get<0>(o.betas());
  h.beta2 = std::get<1>(o.betas());
  h.eps = o.eps();
  h.weight_decay = o.weight_decay();
  h.bias_correction = o.bias_correction();
  h.eps_inside_sqrt = o.eps_inside_sqrt();
  h.max_coeff = o.max_coeff();
  h.min_coeff = o.min_coeff();
  TANDEM_CHECK_ARG(h.lr >= 0 && h.eps >= 0 && h.weight_decay >= 0 && h.beta1 >= 0 &&
                       h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1 && h.min_coeff <= h.max_coeff,
                   "{}: Lamb options lr {}, betas ({}, {}), eps {}, weight_decay {}, "
                   "min_coeff {}, max_coeff {}: lr, eps and weight_decay must be >= 0, the betas "
                   "in [0, 1), and min_coeff <= max_coeff",
                   where, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.min_coeff,
                   h.max_coeff);
  return h;
}

at::Tensor lamb_direction(const at::Tensor& p, const at::Tensor& grad, at::Tensor& exp_avg,
                          at::Tensor& exp_avg_sq, const LambHyper& h, double* p_squares,
                          double* u_squares) {
  exp_avg.mul_(h.beta1).add_(grad, 1 - h.beta1);
  exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
  at::Tensor denom =
      h.eps_inside_sqrt ? exp_avg_sq.add(h.eps).sqrt_() : exp_avg_sq.sqrt().add_(h.eps);
  at::Tensor u = exp_avg / denom;
  if (h.weight_decay != 0) u.add_(p, h.weight_decay);
  const at::Tensor p64 = p.reshape(-1).to(at::kDouble);
  const at::Tensor u64 = u.reshape(-1).to(at::kDouble);
  *p_squares += p64.dot(p64).item<double>();
  *u_squares += u64.dot(u64).item<double>();
  return u;
}

double lamb_factor(const LambHyper& h, int64_t step, double p_squares, double u_squares) {
  const double p_norm = std::sqrt(p_squares);
  const double u_norm = std::sqrt(u_squares);
  double ratio = 1.0;
  if (p_norm != 0 && u_norm != 0) ratio = std::clamp(p_norm / u_norm, h.min_coeff, h.max_coeff);
  double step_size = h.lr;
  if (h.bias_correction) {
    const double t = static_cast<double>(step);
    step_size = h.lr * std::sqrt(1 - std::pow(h.beta2, t)) / (1 - std::pow(h.beta1, t));
  }
  return step_size * ratio;
}

}  // namespace tandem::detail
