#pragma once
// The MLP shape and initial values that the Accelerator tests share.

#include <torch/torch.h>

#include "parallel/ddp_test_models.h"

namespace tandem::testing {

inline constexpr int kIn = 6, kHidden = 16, kOut = 3;

// The same initial weights on every call. It seeds and draws from the global
// generator: call it before rank threads start, never inside one.
inline Mlp reference_init() {
  torch::manual_seed(5);
  return Mlp(kIn, kHidden, kOut);
}

}  // namespace tandem::testing
