#pragma once
// Launchers of fused_cross_entropy's CUDA kernels (cross_entropy_cuda.cu),
// with raw pointers so that the .cu file needs no LibTorch header. Built only
// when TANDEM_CUDA_KERNELS_BUILT (the generated amp/cuda_kernels_config.h);
// src/amp/cross_entropy.cpp is the one caller, and it checks every argument
// first.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "amp/kernel_value_type.h"

namespace tandem::cross_entropy_cuda {

using LogitsType = cuda_kernels::ValueType;

// One block per row of `logits` ([rows, classes], contiguous): row_loss[r] =
// lse - logits[r, targets[r]] and lse_out[r] = log-sum-exp of the row, both
// fp32; a row whose target is ignore_index gets 0 in both and is not read.
// Returns the launch's error (cudaSuccess when rows is 0: nothing runs).
cudaError_t launch_forward(const void* logits, LogitsType type, const int64_t* targets,
                           int64_t rows, int64_t classes, int64_t ignore_index, float* row_loss,
                           float* lse_out, cudaStream_t stream);

// grad[r, j] = (exp(logits[r, j] - lse[r]) - (j == targets[r])) *
// scale[r * scale_stride], in the logits' dtype; rows whose target is
// ignore_index get zeros. `scale` is fp32 on the device, so that nothing
// waits for the host: one value (stride 0; the upstream gradient, over the
// count of targets for a mean) or one per row (stride 1; no reduction).
cudaError_t launch_backward(const void* logits, LogitsType type, const int64_t* targets,
                            const float* lse, const float* scale, int64_t scale_stride,
                            int64_t rows, int64_t classes, int64_t ignore_index, void* grad,
                            cudaStream_t stream);

}  // namespace tandem::cross_entropy_cuda
