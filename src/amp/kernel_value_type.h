#pragma once
// The element types tandem's CUDA kernels take (amp/*_cuda.cu), named
// without LibTorch so that the .cu files include none of its headers; the
// host side maps a c10::ScalarType onto them.

#if !defined(__CUDACC__)
#include <optional>

#include <c10/core/ScalarType.h>
#endif

namespace tandem::cuda_kernels {

enum class ValueType { kFloat, kHalf, kBFloat16 };

#if !defined(__CUDACC__)
// The kernels' name for `type`; empty for a type they do not take.
inline std::optional<ValueType> kernel_value_type(c10::ScalarType type) {
  if (type == c10::kFloat) return ValueType::kFloat;
  if (type == c10::kHalf) return ValueType::kHalf;
  if (type == c10::kBFloat16) return ValueType::kBFloat16;
  return std::nullopt;
}
#endif

}  // namespace tandem::cuda_kernels
