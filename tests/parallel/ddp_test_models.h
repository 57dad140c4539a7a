#pragma once
// Small models and helpers shared by the DDP tests.

#include <torch/torch.h>

#include <vector>

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

// Largest |a - b| / (|b| + 1e-8) over all parameters, pairing by name.
inline double max_relative_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  double worst = 0;
  auto pb = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    auto diff = (item.value() - pb[item.key()]).abs() / (pb[item.key()].abs() + 1e-8);
    // Relative error is meaningless where the reference is ~0: use absolute there.
    auto abs_diff = (item.value() - pb[item.key()]).abs();
    auto err = torch::where(pb[item.key()].abs() > 1e-3, diff, abs_diff);
    worst = std::max(worst, err.max().item<double>());
  }
  return worst;
}

}  // namespace tandem::testing
