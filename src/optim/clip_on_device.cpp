// Gradient-norm clipping in device tensors (clip_on_device.h).

#include "optim/clip_on_device.h"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/add.h>
#include <ATen/ops/div.h>

namespace tandem::detail {

at::Tensor clip_grad_norm_on_device(const std::vector<at::Tensor>& grads, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2);
  for (auto& norm : norms) {
    if (norm.scalar_type() != at::kFloat) norm = norm.to(at::kFloat);
  }
  at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  at::Tensor coef =
      at::full({}, max_norm, total.options()).div_(at::add(total, 1e-6)).clamp_max_(1.0);
  at::_foreach_mul_(grads, coef);
  return total;
}

}  // namespace tandem::detail
