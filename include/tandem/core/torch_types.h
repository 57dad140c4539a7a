#pragma once
// LibTorch types that tandem's public headers hold and whose spelling
// changed across LibTorch releases. Named by what the API returns, so this
// file needs no version test; src/core/torch_compat.h includes it.

#include <ATen/core/Tensor.h>

namespace tandem::compat {

// Key of torch::optim::Optimizer::state(): the parameter's TensorImpl
// pointer (1.x printed that address into a string).
using OptimizerStateKey = void*;
inline OptimizerStateKey optimizer_state_key(const at::Tensor& p) {
  return p.unsafeGetTensorImpl();
}

}  // namespace tandem::compat
