#pragma once
// Gradient-norm clipping without a read back to the host: the arithmetic of
// PyTorch's clip_grad_norm_ (foreach norms, their L2 norm in fp32, a scale
// of min(1, max_norm / (total + 1e-6)) multiplied in), all in device
// tensors. The eager step on CUDA gradients (the config's gradient_clipping,
// when no caller wants the norm back) and the captured step
// (accelerate/cuda_graph_step.h) both use it, so the two give the same
// parameters bit for bit.
//
// Private to tandem. Not thread-safe.

#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::detail {

// Scales `grads` (defined, on one device, each listed once) in place and
// returns their total L2 norm before clipping, an fp32 0-dim tensor on
// their device. `max_norm` > 0.
at::Tensor clip_grad_norm_on_device(const std::vector<at::Tensor>& grads, double max_norm);

}  // namespace tandem::detail
