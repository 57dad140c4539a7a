#pragma once
// The MLP shape, initial values and data that the Accelerator tests (and the
// GPU kit's Accelerator checks) share.

#include <torch/torch.h>

#include "support/ddp_test_models.h"
#include "tandem/config/config.h"

namespace tandem::testing {

inline constexpr int kIn = 6, kHidden = 16, kOut = 3;

// The same initial weights on every call. It seeds and draws from the global
// generator: call it before rank threads start, never inside one.
inline Mlp reference_init() {
  torch::manual_seed(5);
  return Mlp(kIn, kHidden, kOut);
}

// Inputs and targets for the MLP above, drawn from the global generator:
// call before rank threads start.
struct Dataset {
  torch::Tensor x, y;
};

inline Dataset make_dataset(int64_t n, uint64_t seed = 11) {
  torch::manual_seed(seed);
  return {torch::randn({n, kIn}), torch::randn({n, kOut})};
}

inline Config config_with_accumulation(int64_t steps) {
  Config config;
  config.gradient_accumulation_steps = steps;
  return config;
}

}  // namespace tandem::testing
