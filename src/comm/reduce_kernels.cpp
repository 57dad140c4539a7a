#include "comm/reduce_kernels.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace tandem::detail {
namespace {

// Blocks of 4096 elements keep the running result in L1 while each source
// streams through once.
constexpr std::int64_t kBlock = 4096;

template <typename T, typename Combine>
void fused(T* __restrict dst, const void* const* srcs, int n, std::int64_t count, Combine combine,
           T scale, bool apply_scale) {
  for (std::int64_t start = 0; start < count; start += kBlock) {
    const std::int64_t len = std::min(kBlock, count - start);
    T acc[kBlock];
    const T* __restrict s0 = static_cast<const T*>(srcs[0]) + start;
    for (std::int64_t i = 0; i < len; ++i) acc[i] = s0[i];
    for (int k = 1; k < n; ++k) {
      const T* __restrict sk = static_cast<const T*>(srcs[k]) + start;
      for (std::int64_t i = 0; i < len; ++i) acc[i] = combine(acc[i], sk[i]);
    }
    T* __restrict d = dst + start;
    if (apply_scale) {
      for (std::int64_t i = 0; i < len; ++i) d[i] = acc[i] * scale;
    } else {
      for (std::int64_t i = 0; i < len; ++i) d[i] = acc[i];
    }
  }
}

template <typename T>
void fused_op(void* dst, const void* const* srcs, int n, std::int64_t count, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T scale = static_cast<T>(1) / static_cast<T>(n);
  switch (op) {
    case ReduceOp::kSum:
      fused<T>(d, srcs, n, count, [](T a, T b) { return a + b; }, scale, false);
      break;
    case ReduceOp::kAvg:
      fused<T>(d, srcs, n, count, [](T a, T b) { return a + b; }, scale, true);
      break;
    case ReduceOp::kMax:
      fused<T>(d, srcs, n, count, [](T a, T b) { return a < b ? b : a; }, scale, false);
      break;
    case ReduceOp::kMin:
      fused<T>(d, srcs, n, count, [](T a, T b) { return b < a ? b : a; }, scale, false);
      break;
  }
}

void aten_reduce(void* dst, const void* const* srcs, int n, std::int64_t count,
                 c10::ScalarType dtype, ReduceOp op) {
  auto options = at::TensorOptions().dtype(dtype);
  auto view = [&](const void* p) { return at::from_blob(const_cast<void*>(p), {count}, options); };
  // bfloat16 and half sum in fp32 and round once at the end, as Gloo's
  // path does: the result then does not depend on the transport or on the
  // order the ranks' values are added in.
  const bool widen = dtype == at::kBFloat16 || dtype == at::kHalf;
  at::Tensor acc = widen ? view(srcs[0]).to(at::kFloat) : view(srcs[0]).clone();
  for (int k = 1; k < n; ++k) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc.add_(view(srcs[k])); break;
      case ReduceOp::kMax: at::maximum_out(acc, acc, view(srcs[k])); break;
      case ReduceOp::kMin: at::minimum_out(acc, acc, view(srcs[k])); break;
    }
  }
  if (op == ReduceOp::kAvg) acc.div_(n);
  view(dst).copy_(acc);
}

}  // namespace

bool reducible_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kInt:
    case at::kLong:
    case at::kByte:
    case at::kChar:
      return true;
    default:
      return false;
  }
}

void reduce_buffers(void* dst, const void* const* srcs, int n, std::int64_t count,
                    c10::ScalarType dtype, ReduceOp op) {
  if (count <= 0) return;
  if (dtype == at::kFloat) return fused_op<float>(dst, srcs, n, count, op);
  if (dtype == at::kDouble) return fused_op<double>(dst, srcs, n, count, op);
  aten_reduce(dst, srcs, n, count, dtype, op);
}

}  // namespace tandem::detail
