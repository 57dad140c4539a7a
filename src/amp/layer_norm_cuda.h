#pragma once
// Launchers of fused_layer_norm's CUDA kernels (layer_norm_cuda.cu), with
// raw pointers so that the .cu file needs no LibTorch header. Built only when
// TANDEM_CUDA_KERNELS_BUILT (the generated amp/cuda_kernels_config.h);
// src/amp/layer_norm.cpp is the one caller, and it checks every argument
// first. Every tensor is contiguous; rows x columns is the input's shape,
// normalised over each row.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "amp/kernel_value_type.h"

namespace tandem::layer_norm_cuda {

using cuda_kernels::ValueType;

// Which (input, output) dtype pairs the kernels take: float to any of the
// three, and each half type to itself.
bool takes(ValueType input, ValueType output);

// y = (x - mean) * rstd * gamma + beta per row, in fp32, stored as `output`;
// mean and rstd (fp32, one per row) are kept for backward. gamma and beta
// may be null (1 and 0).
cudaError_t launch_forward(const void* x, ValueType input, void* y, ValueType output,
                           const float* gamma, const float* beta, int64_t rows, int64_t columns,
                           float eps, float* mean, float* rstd, cudaStream_t stream);

// The same for sum = residual + delta, the residual stream's add before a
// pre-LN block's LayerNorm: sum (sum_type; the residual is too, and delta
// is `output`) is stored, and normalised as above into y.
cudaError_t launch_add_forward(const void* residual, ValueType sum_type, const void* delta,
                               void* sum, void* y, ValueType output, const float* gamma,
                               const float* beta, int64_t rows, int64_t columns, float eps,
                               float* mean, float* rstd, cudaStream_t stream);

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row, g = dy * gamma,
// xhat = (x - mean) * rstd, plus add_grad where it is not null (the
// gradient that reached a sum directly). Stored in the input's dtype to dx
// and in the output's to dx_out, each where not null.
cudaError_t launch_backward_input(const void* dy, ValueType output, const void* x,
                                  ValueType input, const float* gamma, const float* mean,
                                  const float* rstd, int64_t rows, int64_t columns,
                                  const void* add_grad, void* dx, void* dx_out,
                                  cudaStream_t stream);

// Column sums over chunks of rows: partial_dgamma[c, j] = sum of dy * xhat
// and partial_dbeta[c, j] = sum of dy over the rows of partial row c's
// chunks (partial_rows(rows) of them, each [columns]); the caller adds the
// partial rows. Either output may be null (not wanted).
int64_t partial_rows(int64_t rows);
cudaError_t launch_backward_affine(const void* dy, ValueType output, const void* x,
                                   ValueType input, const float* mean, const float* rstd,
                                   int64_t rows, int64_t columns, float* partial_dgamma,
                                   float* partial_dbeta, cudaStream_t stream);

}  // namespace tandem::layer_norm_cuda
