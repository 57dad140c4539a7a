#pragma once
// Cross-entropy over low-precision logits without an fp32 copy of them.
//
// Under autocast a language model's output projection gives bf16 or fp16
// logits, and `torch::nn::functional::cross_entropy` (an fp32 op of
// autocast's) first copies them to fp32, takes an fp32 log-softmax and, in
// backward, writes an fp32 gradient that is then cast back. For GPT-2 124m
// at batch 16 x 1024 that is about 20 GB of memory traffic per step for a
// [16384, 50304] tensor (by arithmetic; docs/performance.md, "GPT-2 on one
// H100", measured the copies and the softmax at about 7 ms of a 56 ms step).
// fused_cross_entropy computes the same loss in two passes over the logits
// as they are: forward reads them once (an online max and sum of
// exponentials per row, in fp32) and keeps one fp32 log-sum-exp per row;
// backward reads them once more and writes the gradient in the logits'
// dtype.
//
// Thread-safety: no state; concurrent calls on different tensors are safe.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tandem {

enum class CrossEntropyReduction {
  kMean,  // over the non-ignored targets (PyTorch's "mean")
  kSum,   // over all targets, ignored ones adding 0 ("sum")
  kNone,  // one loss per target, 0 for ignored ones, shaped like targets ("none")
};

struct CrossEntropyOptions {
  // Targets equal to this are left out of the loss and the mean, and get a
  // zero gradient (PyTorch's ignore_index).
  int64_t ignore_index = -100;
  CrossEntropyReduction reduction = CrossEntropyReduction::kMean;
};

// -log softmax(logits)[target] per target, reduced as options.reduction
// says, in fp32: what
//   torch::nn::functional::cross_entropy(
//       logits.reshape({-1, classes}).to(torch::kFloat), targets.reshape({-1}),
//       CrossEntropyFuncOptions().ignore_index(ignore_index).reduction(...))
// gives (reshaped to targets' shape for kNone), differentiable with respect
// to the logits. With every target ignored the mean is 0/0 = NaN, as
// PyTorch's.
//
// logits: [..., classes], float32, bfloat16 or float16; targets: int64 with
// logits' shape less the last dimension (class indices, no probabilities).
// The gradient has the logits' dtype.
//
// On CUDA, when the library was built with its CUDA kernels (CMake option
// TANDEM_CUDA_KERNELS with a CUDA LibTorch and nvcc; `tandem env` lists
// them), both passes are tandem's kernels: no fp32 logits, no fp32 gradient,
// no host synchronisation (safe inside a CUDA graph capture). A target
// outside [0, classes) that is not ignore_index stops the kernel with a
// device-side assertion, as PyTorch's does. Elsewhere (CPU, or a build
// without the kernels) it is exactly the expression above, through
// LibTorch's ops; fused_cross_entropy_uses_kernel() says which.
//
// Throws UsageError on other dtypes, non-int64 targets or shapes that do not
// match, before anything runs.
at::Tensor fused_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                               const CrossEntropyOptions& options = {});

// Whether fused_cross_entropy runs tandem's CUDA kernels for these logits.
bool fused_cross_entropy_uses_kernel(const at::Tensor& logits);

// Whether this build of the library holds its CUDA kernels.
bool built_with_cuda_kernels();

}  // namespace tandem
