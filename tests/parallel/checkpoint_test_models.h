#pragma once
// Models for the activation checkpointing tests: residual blocks with
// dropout, marked tandem::Checkpointed, between a plain input layer and a
// checkpointed head, so that the first gradients of a backward are computed
// inside a checkpoint's nested backward and the last ones outside it.

#include <map>
#include <string>

#include <torch/torch.h>

#include "tandem/parallel/activation_checkpoint.h"

namespace tandem::testing {

struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl(int width, double dropout) : dropout(dropout) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc1 = register_module("fc1", torch::nn::Linear(width, 2 * width));
    fc2 = register_module("fc2", torch::nn::Linear(2 * width, width));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::gelu(fc1(norm(x)));
    return x + fc2(torch::dropout(h, dropout, is_training()));
  }
  double dropout;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

struct HeadImpl : torch::nn::Module {
  HeadImpl(int width, int out) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    proj = register_module("proj", torch::nn::Linear(width, out));
  }
  torch::Tensor forward(torch::Tensor x) { return proj(norm(x)); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear proj{nullptr};
};

// input (plain) -> depth x Checkpointed<DropBlock> -> Checkpointed<Head>.
struct CheckpointNetImpl : torch::nn::Module {
  CheckpointNetImpl(int in, int width, int out, int depth, double dropout) {
    input = register_module("input", torch::nn::Linear(in, width));
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       Checkpointed<DropBlockImpl>(width, dropout)));
    }
    head = register_module("head", Checkpointed<HeadImpl>(width, out));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = input(x);
    for (auto& block : blocks) x = block->forward(x);
    return head->forward(x);
  }
  torch::nn::Linear input{nullptr};
  std::vector<Checkpointed<DropBlockImpl>> blocks;
  Checkpointed<HeadImpl> head{nullptr};
};
TORCH_MODULE(CheckpointNet);

inline std::map<std::string, torch::Tensor> gradients_of(const torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::Tensor();
  }
  return out;
}

// Names of the entries that differ in any bit (or in being defined).
inline std::string bitwise_differences(const std::map<std::string, torch::Tensor>& a,
                                       const std::map<std::string, torch::Tensor>& b) {
  std::string out;
  for (const auto& [name, t] : b) {
    const auto& other = a.at(name);
    const bool same = t.defined() == other.defined() && (!t.defined() || torch::equal(t, other));
    if (!same) out += name + " ";
  }
  return out;
}

}  // namespace tandem::testing
