#pragma once
// One multi-tensor launch for a LibTorch Adam or AdamW step on the GPU.
//
// LibTorch's C++ Adam and AdamW step one parameter at a time, about seven
// kernels each: on a GPU a small model's step is then bound by launches.
// PyTorch's own fused kernels (at::_fused_adam_ / at::_fused_adamw_, what
// Python's `torch.optim.AdamW(fused=True)` and DeepSpeed's FusedAdam run)
// update every parameter of a dtype in one launch, reading and writing each
// state tensor once. The state stays where LibTorch keeps it (the
// optimizer's AdamParamState / AdamWParamState: step, exp_avg, exp_avg_sq,
// max_exp_avg_sq), so checkpoints, schedulers and a later plain step see
// the same optimizer. The arithmetic is Adam's, in fp32 with the bias
// corrections computed in the kernel: results agree with LibTorch's loop to
// rounding (about 1e-7 relative per step), not bit for bit.
//
// Private to tandem. Not thread-safe: the training thread calls it.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace tandem::detail {

// grad with param's strides where they differ only on dimensions of size 1
// (which backward may lay out either way, and which address the same
// elements): the fused Adam kernels take parameters and gradients of one
// layout. The eager step (try_fused_adam_step) and the captured one
// (cuda_graph_step.cpp) both hand the kernels this view, so they update
// such a parameter alike.
inline at::Tensor with_strides_of(const at::Tensor& param, const at::Tensor& grad) {
  if (grad.strides() == param.strides() || grad.sizes() != param.sizes()) return grad;
  for (int64_t d = 0; d < param.dim(); ++d) {
    if (param.size(d) != 1 && param.stride(d) != grad.stride(d)) return grad;
  }
  return grad.as_strided(param.sizes(), param.strides(), grad.storage_offset());
}

// Steps `optimizer` with the fused kernels and returns true when it is
// exactly a torch::optim::Adam or AdamW whose parameters with gradients are
// all on CUDA (or anywhere, with `any_device`), dense, each listed once, with
// gradients and state of the parameter's dtype, sizes and strides (a
// gradient's strides may differ on dimensions of size 1: with_strides_of).
// Returns false, having changed nothing, otherwise: the caller then runs the
// optimizer's own step(). Parameters without a gradient are left alone, as
// LibTorch does. TANDEM_FUSED_ADAM=0 in the environment turns it off (a
// value other than 0 or 1 is a UsageError).
bool try_fused_adam_step(torch::optim::Optimizer& optimizer, bool any_device = false);

}  // namespace tandem::detail
