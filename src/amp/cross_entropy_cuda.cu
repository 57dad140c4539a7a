// fused_cross_entropy's two kernels (see tandem/amp/cross_entropy.h). Both
// give each row of the logits one block of kThreads threads; a thread takes
// every kThreads-th pack of kVec values (16 bytes when the rows allow it), so
// a warp reads whole 512-byte spans. Forward keeps a running (max, sum of
// exp) per thread and joins the block's in one tree (cross_entropy_math.h);
// backward recomputes each probability from the row's log-sum-exp and
// writes the gradient directly in the logits' dtype. No fp32 copy of the
// logits exists at any point, and nothing synchronises with the host, so
// both can be captured in a CUDA graph.

#include "amp/cross_entropy_cuda.h"

#include <cassert>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "amp/cross_entropy_math.h"

namespace tandem::cross_entropy_cuda {
namespace {

using cross_entropy_math::MaxSum;

// 8 warps: with 50304 classes in bf16, 24-25 packs of 8 per thread, and
// enough blocks in flight per SM to hide the loads.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

__device__ __forceinline__ MaxSum warp_reduce(MaxSum v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, offset),
                       __shfl_xor_sync(0xffffffffu, v.s, offset)};
    v = cross_entropy_math::combine(v, other);
  }
  return v;
}

// The block's pair, valid in thread 0.
__device__ MaxSum block_reduce(MaxSum v) {
  __shared__ MaxSum per_warp[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_reduce(v);
  if (lane == 0) per_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? per_warp[lane] : cross_entropy_math::empty_max_sum();
    v = warp_reduce(v);
  }
  return v;
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                   int64_t classes, int64_t ignore_index, float* __restrict__ row_loss,
                   float* __restrict__ lse_out) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  if (target == ignore_index) {  // the same for every thread of the block
    if (threadIdx.x == 0) {
      row_loss[row] = 0.0f;
      lse_out[row] = 0.0f;
    }
    return;
  }
  const T* x = logits + row * classes;
  const auto* packs = reinterpret_cast<const Pack<T, kVec>*>(x);
  const int64_t n_packs = classes / kVec;
  MaxSum acc = cross_entropy_math::empty_max_sum();
  for (int64_t i = threadIdx.x; i < n_packs; i += kThreads) {
    const Pack<T, kVec> pack = packs[i];
    float values[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) values[k] = to_float(pack.v[k]);
    acc = cross_entropy_math::add_values(acc, values, kVec);
  }
  acc = block_reduce(acc);
  if (threadIdx.x == 0) {
    assert(target >= 0 && target < classes &&
           "fused_cross_entropy: a target is outside [0, classes) and is not ignore_index");
    const float lse = cross_entropy_math::log_sum_exp(acc);
    lse_out[row] = lse;
    row_loss[row] = lse - to_float(x[target]);
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                    const float* __restrict__ lse, const float* __restrict__ scale,
                    int64_t scale_stride, int64_t classes, int64_t ignore_index,
                    T* __restrict__ grad) {
  const int64_t row = blockIdx.x;
  const int64_t target = targets[row];
  auto* out = reinterpret_cast<Pack<T, kVec>*>(grad + row * classes);
  const int64_t n_packs = classes / kVec;
  if (target == ignore_index) {
    Pack<T, kVec> zeros;
#pragma unroll
    for (int k = 0; k < kVec; ++k) zeros.v[k] = from_float<T>(0.0f);
    for (int64_t i = threadIdx.x; i < n_packs; i += kThreads) out[i] = zeros;
    return;
  }
  const auto* in = reinterpret_cast<const Pack<T, kVec>*>(logits + row * classes);
  const float row_lse = lse[row];
  const float factor = scale[row * scale_stride];
  for (int64_t i = threadIdx.x; i < n_packs; i += kThreads) {
    const Pack<T, kVec> pack = in[i];
    Pack<T, kVec> result;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const bool is_target = i * kVec + k == target;
      result.v[k] = from_float<T>(
          cross_entropy_math::softmax_minus_one_hot(to_float(pack.v[k]), row_lse, is_target) *
          factor);
    }
    out[i] = result;
  }
}

// 16-byte packs when every row starts on a 16-byte boundary, else one value
// at a time (an odd vocabulary, or a misaligned view).
template <typename T>
bool rows_take_packs(int64_t classes, const void* a, const void* b) {
  constexpr int kVec = 16 / sizeof(T);
  return classes % kVec == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

template <typename T>
cudaError_t forward_typed(const void* logits, const int64_t* targets, int64_t rows,
                          int64_t classes, int64_t ignore_index, float* row_loss, float* lse,
                          cudaStream_t stream) {
  const auto* x = static_cast<const T*>(logits);
  if (rows_take_packs<T>(classes, logits, logits)) {
    forward_kernel<T, 16 / sizeof(T)><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, targets, classes, ignore_index, row_loss, lse);
  } else {
    forward_kernel<T, 1><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, targets, classes, ignore_index, row_loss, lse);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_typed(const void* logits, const int64_t* targets, const float* lse,
                           const float* scale, int64_t scale_stride, int64_t rows,
                           int64_t classes, int64_t ignore_index, void* grad,
                           cudaStream_t stream) {
  const auto* x = static_cast<const T*>(logits);
  auto* g = static_cast<T*>(grad);
  if (rows_take_packs<T>(classes, logits, grad)) {
    backward_kernel<T, 16 / sizeof(T)><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, targets, lse, scale, scale_stride, classes, ignore_index, g);
  } else {
    backward_kernel<T, 1><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, targets, lse, scale, scale_stride, classes, ignore_index, g);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_forward(const void* logits, LogitsType type, const int64_t* targets,
                           int64_t rows, int64_t classes, int64_t ignore_index, float* row_loss,
                           float* lse_out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  switch (type) {
    case LogitsType::kFloat:
      return forward_typed<float>(logits, targets, rows, classes, ignore_index, row_loss, lse_out,
                                  stream);
    case LogitsType::kHalf:
      return forward_typed<__half>(logits, targets, rows, classes, ignore_index, row_loss,
                                   lse_out, stream);
    case LogitsType::kBFloat16:
      return forward_typed<__nv_bfloat16>(logits, targets, rows, classes, ignore_index, row_loss,
                                          lse_out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_backward(const void* logits, LogitsType type, const int64_t* targets,
                            const float* lse, const float* scale, int64_t scale_stride,
                            int64_t rows, int64_t classes, int64_t ignore_index, void* grad,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  switch (type) {
    case LogitsType::kFloat:
      return backward_typed<float>(logits, targets, lse, scale, scale_stride, rows, classes,
                                   ignore_index, grad, stream);
    case LogitsType::kHalf:
      return backward_typed<__half>(logits, targets, lse, scale, scale_stride, rows, classes,
                                    ignore_index, grad, stream);
    case LogitsType::kBFloat16:
      return backward_typed<__nv_bfloat16>(logits, targets, lse, scale, scale_stride, rows,
                                           classes, ignore_index, grad, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tandem::cross_entropy_cuda
