#pragma once
// LayerNorm over the last dimension, computed in fp32 and written in the
// dtype the next layer reads.
//
// Under autocast a pre-LayerNorm transformer keeps its residual stream in
// fp32, and LibTorch's layer_norm (an fp32 op of autocast's) writes fp32
// rows that the next Linear then copies to bf16; in backward the bf16
// gradient is copied back to fp32 before layer_norm's backward reads it.
// fused_layer_norm writes its output in `output_dtype` directly and its
// backward reads that dtype's gradient, so neither copy exists; the
// statistics and the arithmetic stay fp32.
//
// Thread-safety: no state; concurrent calls on different tensors are safe.

#include <optional>

#include <ATen/core/Tensor.h>

namespace tandem {

struct FusedLayerNormOptions {
  double eps = 1e-5;
  // The output's dtype; empty: the input's. A pre-LN block under autocast
  // passes the autocast dtype (tandem::autocast_dtype()), which is what the
  // following Linear would have cast the output to.
  std::optional<at::ScalarType> output_dtype;
};

// What
//   at::layer_norm(input.to(torch::kFloat), {input.size(-1)}, weight, bias, eps)
//       .to(output_dtype)
// gives, differentiable with respect to input, weight and bias (each
// gradient in its tensor's dtype). weight and bias: [input.size(-1)] float32,
// or undefined (1 and 0). input: float32, bfloat16 or float16.
//
// On CUDA, in a build with tandem's CUDA kernels (TANDEM_CUDA_KERNELS;
// `tandem env`), for float32 input to any output dtype and for bfloat16 or
// float16 input to its own dtype: tandem's kernels, with no host
// synchronisation (safe in a CUDA graph capture); each output value within
// rounding of the expression above (two-pass statistics in fp32 instead of
// LibTorch's Welford). Elsewhere the expression itself, through LibTorch's
// ops; fused_layer_norm_uses_kernel() says which. Throws UsageError on other
// dtypes or shapes, before anything runs.
at::Tensor fused_layer_norm(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const FusedLayerNormOptions& options = {});

// Whether fused_layer_norm runs tandem's CUDA kernels for these arguments.
bool fused_layer_norm_uses_kernel(const at::Tensor& input, const at::Tensor& weight,
                                  const at::Tensor& bias, const FusedLayerNormOptions& options = {});

// The residual stream's add and the LayerNorm after it, the pair a pre-LN
// transformer runs between its sublayers (x = x + attn(...); then ln_2(x)).
struct AddLayerNormOutput {
  at::Tensor sum;         // residual + delta, in their promoted dtype
  at::Tensor normalized;  // the LayerNorm of sum, in output_dtype (default: sum's dtype)
};

// What
//   sum = residual + delta;
//   normalized = fused_layer_norm(sum, weight, bias, options)
// gives, differentiable with respect to residual, delta, weight and bias.
// residual and delta: one shape (no broadcasting), float32, bfloat16 or
// float16, on one device. On CUDA with tandem's kernels, when the residual
// is float32 or delta's dtype and output_dtype is delta's (the fp32
// residual stream and a bf16 sublayer output under autocast), one kernel
// reads both addends and writes sum and normalized, and one backward kernel
// writes both addends' gradients (the residual's in its dtype, delta's in
// its own), the gradient that reached sum directly added in. A sum whose
// gradient never arrives (the last block's, read only by the final
// LayerNorm) costs nothing in backward. Elsewhere the expression itself;
// fused_add_layer_norm_uses_kernel() says which. Throws UsageError on other
// dtypes or shapes, before anything runs.
AddLayerNormOutput fused_add_layer_norm(const at::Tensor& residual, const at::Tensor& delta,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        const FusedLayerNormOptions& options = {});

// Whether fused_add_layer_norm runs tandem's CUDA kernels for these
// arguments.
bool fused_add_layer_norm_uses_kernel(const at::Tensor& residual, const at::Tensor& delta,
                                      const at::Tensor& weight, const at::Tensor& bias,
                                      const FusedLayerNormOptions& options = {});

}  // namespace tandem
