// fused_layer_norm's kernels (see tandem/amp/fused_layer_norm.h). A warp
// normalises one row: the mean, then the variance around it (two passes, so
// no cancellation), then the output, each pass a strided walk over the row
// that the first one brought into cache (L1 for the read-only input; L2 for
// the sum that fused_add_layer_norm's first pass stores). The output is written in its own
// dtype: under autocast the next Linear reads bf16, and no fp32 copy of the
// normalised rows is ever stored. Backward is a warp per row for the input's
// gradient and a column walk over chunks of rows for gamma's and beta's
// (their chunks are added by the caller). Nothing synchronises with the host.

#include "amp/layer_norm_cuda.h"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tandem::layer_norm_cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
// gamma's and beta's column sums: a thread per column walks a chunk of rows.
// 32-row chunks make GPT-2 124m's [16384, 768] 3 x 512 blocks of 256 threads,
// enough to fill an H100 (132 SMs x 2048 threads); 128-row ones made 384
// blocks, about a third of it. The partial rows cost 512 x 768 fp32 each,
// added by one sum.
constexpr int kRowsPerChunk = 32;
constexpr int kColumnThreads = 256;

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A value of type T's precision: what storing v as T and loading it gives.
template <typename T>
__device__ __forceinline__ float rounded_to(float v) {
  T t;
  store(&t, 0, v);
  return load(&t, 0);
}

// With kAdd, the row normalised is sum = x + delta, rounded to In and
// stored first (the residual stream's next value); the later passes read it
// back from `sum`, which this thread wrote itself (a plain load, not the
// read-only path that `x` may take).
template <typename In, typename Out, bool kAdd>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    forward_kernel(const In* __restrict__ x, const Out* __restrict__ delta, In* sum_out,
                   Out* __restrict__ y, const float* __restrict__ gamma,
                   const float* __restrict__ beta, int64_t rows, int64_t columns, float eps,
                   float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const In* in = x + row * columns;
  float sum = 0.0f;
  if constexpr (kAdd) {
    const Out* d = delta + row * columns;
    In* s = sum_out + row * columns;
    for (int64_t j = lane; j < columns; j += 32) {
      const float v = rounded_to<In>(load(in, j) + load(d, j));
      store(s, j, v);
      sum += v;
    }
    in = s;
  } else {
    for (int64_t j = lane; j < columns; j += 32) sum += load(in, j);
  }
  const float mean = warp_sum(sum) / static_cast<float>(columns);
  float squares = 0.0f;
  for (int64_t j = lane; j < columns; j += 32) {
    const float d = load(in, j) - mean;
    squares += d * d;
  }
  const float rstd = rsqrtf(warp_sum(squares) / static_cast<float>(columns) + eps);
  Out* out = y + row * columns;
  for (int64_t j = lane; j < columns; j += 32) {
    float v = (load(in, j) - mean) * rstd;
    if (gamma != nullptr) v *= gamma[j];
    if (beta != nullptr) v += beta[j];
    store(out, j, v);
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// The input's gradient; with add_grad (the residual's own gradient, when
// the row was a sum) added to it. Written as In to dx and as Out to
// dx_out, each when not null: a sum's two addends get the same gradient,
// each in its dtype.
template <typename In, typename Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    backward_input_kernel(const Out* __restrict__ dy, const In* __restrict__ x,
                          const float* __restrict__ gamma, const float* __restrict__ mean,
                          const float* __restrict__ rstd, int64_t rows, int64_t columns,
                          const In* __restrict__ add_grad, In* __restrict__ dx,
                          Out* __restrict__ dx_out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const Out* g_row = dy + row * columns;
  const In* in = x + row * columns;
  const float m = mean[row], r = rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int64_t j = lane; j < columns; j += 32) {
    const float g = load(g_row, j) * (gamma != nullptr ? gamma[j] : 1.0f);
    sum_g += g;
    sum_g_xhat += g * ((load(in, j) - m) * r);
  }
  const float inv_columns = 1.0f / static_cast<float>(columns);
  const float a = warp_sum(sum_g) * inv_columns;
  const float b = warp_sum(sum_g_xhat) * inv_columns;
  const int64_t first = row * columns;
  for (int64_t j = lane; j < columns; j += 32) {
    const float g = load(g_row, j) * (gamma != nullptr ? gamma[j] : 1.0f);
    const float xhat = (load(in, j) - m) * r;
    float v = r * (g - a - xhat * b);
    if (add_grad != nullptr) v += load(add_grad, first + j);
    if (dx != nullptr) store(dx, first + j, v);
    if (dx_out != nullptr) store(dx_out, first + j, v);
  }
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kColumnThreads)
    backward_affine_kernel(const Out* __restrict__ dy, const In* __restrict__ x,
                           const float* __restrict__ mean, const float* __restrict__ rstd,
                           int64_t rows, int64_t columns, float* __restrict__ partial_dgamma,
                           float* __restrict__ partial_dbeta) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (j >= columns) return;
  // Block row y sums chunks y, y + gridDim.y, ... (one chunk each unless the
  // rows outnumber 65535 chunks) into partial row y.
  float dgamma = 0.0f, dbeta = 0.0f;
  for (int64_t first = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk; first < rows;
       first += static_cast<int64_t>(gridDim.y) * kRowsPerChunk) {
    const int64_t last = first + kRowsPerChunk < rows ? first + kRowsPerChunk : rows;
    for (int64_t row = first; row < last; ++row) {
      const float g = load(dy, row * columns + j);
      dgamma += g * ((load(x, row * columns + j) - mean[row]) * rstd[row]);
      dbeta += g;
    }
  }
  if (partial_dgamma != nullptr) partial_dgamma[blockIdx.y * columns + j] = dgamma;
  if (partial_dbeta != nullptr) partial_dbeta[blockIdx.y * columns + j] = dbeta;
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Calls fn(In*, Out*) typed for one of the pairs takes() accepts.
template <typename Fn>
cudaError_t dispatch(ValueType input, ValueType output, Fn&& fn) {
  using V = ValueType;
  if (input == V::kFloat && output == V::kFloat) return fn(float{}, float{});
  if (input == V::kFloat && output == V::kBFloat16) return fn(float{}, __nv_bfloat16{});
  if (input == V::kFloat && output == V::kHalf) return fn(float{}, __half{});
  if (input == V::kBFloat16 && output == V::kBFloat16) return fn(__nv_bfloat16{}, __nv_bfloat16{});
  if (input == V::kHalf && output == V::kHalf) return fn(__half{}, __half{});
  return cudaErrorInvalidValue;
}

}  // namespace

bool takes(ValueType input, ValueType output) {
  return input == ValueType::kFloat || input == output;
}

int64_t partial_rows(int64_t rows) {
  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  return chunks < 65535 ? chunks : 65535;  // gridDim.y's limit
}

cudaError_t launch_forward(const void* x, ValueType input, void* y, ValueType output,
                           const float* gamma, const float* beta, int64_t rows, int64_t columns,
                           float eps, float* mean, float* rstd, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch(input, output, [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    forward_kernel<In, Out, false><<<row_blocks(rows), kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const In*>(x), nullptr, nullptr, static_cast<Out*>(y), gamma, beta, rows,
        columns, eps, mean, rstd);
    return cudaGetLastError();
  });
}

cudaError_t launch_add_forward(const void* residual, ValueType sum_type, const void* delta,
                               void* sum, void* y, ValueType output, const float* gamma,
                               const float* beta, int64_t rows, int64_t columns, float eps,
                               float* mean, float* rstd, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch(sum_type, output, [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    forward_kernel<In, Out, true><<<row_blocks(rows), kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const In*>(residual), static_cast<const Out*>(delta), static_cast<In*>(sum),
        static_cast<Out*>(y), gamma, beta, rows, columns, eps, mean, rstd);
    return cudaGetLastError();
  });
}

cudaError_t launch_backward_input(const void* dy, ValueType output, const void* x,
                                  ValueType input, const float* gamma, const float* mean,
                                  const float* rstd, int64_t rows, int64_t columns,
                                  const void* add_grad, void* dx, void* dx_out,
                                  cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return dispatch(input, output, [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    backward_input_kernel<In, Out><<<row_blocks(rows), kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const Out*>(dy), static_cast<const In*>(x), gamma, mean, rstd, rows, columns,
        static_cast<const In*>(add_grad), static_cast<In*>(dx), static_cast<Out*>(dx_out));
    return cudaGetLastError();
  });
}

cudaError_t launch_backward_affine(const void* dy, ValueType output, const void* x,
                                   ValueType input, const float* mean, const float* rstd,
                                   int64_t rows, int64_t columns, float* partial_dgamma,
                                   float* partial_dbeta, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((columns + kColumnThreads - 1) / kColumnThreads),
                  static_cast<unsigned>(partial_rows(rows)));
  return dispatch(input, output, [&](auto in_tag, auto out_tag) {
    using In = decltype(in_tag);
    using Out = decltype(out_tag);
    backward_affine_kernel<In, Out><<<grid, kColumnThreads, 0, stream>>>(
        static_cast<const Out*>(dy), static_cast<const In*>(x), mean, rstd, rows, columns,
        partial_dgamma, partial_dbeta);
    return cudaGetLastError();
  });
}

}  // namespace tandem::layer_norm_cuda
