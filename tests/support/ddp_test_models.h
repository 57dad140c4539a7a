#pragma once
// Small models and helpers shared by the DDP, Accelerator and GPU tests.

#include <torch/torch.h>

#include <vector>

#include "support/parity.h"

namespace tandem::testing {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int in, int hidden, int out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// Copies every parameter and buffer of `from` into `to` (same architecture).
inline void copy_state(torch::nn::Module& to, const torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(src[item.key()]);
  auto src_buffers = from.named_buffers();
  for (auto& item : to.named_buffers()) item.value().copy_(src_buffers[item.key()]);
}

}  // namespace tandem::testing
