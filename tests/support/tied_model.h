#pragma once
// A GPT-shaped model whose output layer reuses the embedding matrix, tied the
// usual LibTorch way: the head registers emb->weight a second time, so
// LibTorch's parameters() lists that tensor twice. Shared by the DDP, ZeRO
// and Accelerator tests of tied weights.

#include <map>
#include <mutex>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/parity.h"

#include "tandem/zero/sharded.h"

namespace tandem::testing {

struct TiedBlockImpl : torch::nn::Module {
  explicit TiedBlockImpl(int dim) {
    fc = register_module("fc", torch::nn::Linear(dim, dim));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  }
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(fc(norm(x))); }
  torch::nn::Linear fc{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};

// The head as a module of its own, holding the tied weight; wrapped in
// Sharded<> it puts the tie across a ZeRO-3 unit boundary.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const torch::Tensor& weight) { w = register_parameter("weight", weight); }
  torch::Tensor forward(torch::Tensor x) { return torch::nn::functional::linear(x, w); }
  torch::Tensor w;
};

struct TiedLmOptions {
  int vocab = 13;
  int dim = 10;    // odd shapes: vocab*dim = 130 splits inside the tensor across 3 ranks
  int depth = 2;
  bool head_in_unit = false;  // the head is a Sharded unit: the tie crosses units
};

struct TiedLmImpl : torch::nn::Module {
  explicit TiedLmImpl(const TiedLmOptions& o) {
    emb = register_module("emb", torch::nn::Embedding(o.vocab, o.dim));
    for (int i = 0; i < o.depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Sharded<TiedBlockImpl>(o.dim)));
    }
    if (o.head_in_unit) {
      head_unit = register_module("head", Sharded<TiedHeadImpl>(emb->weight));
    } else {
      head_weight = register_parameter("head_weight", emb->weight);
    }
  }
  torch::Tensor forward(torch::Tensor ids) {
    auto h = emb(ids);
    for (auto& block : blocks) h = block->forward(h);
    auto logits = head_unit ? head_unit->forward(h) : torch::nn::functional::linear(h, head_weight);
    return logits.reshape({-1, logits.size(-1)});
  }
  torch::nn::Embedding emb{nullptr};
  std::vector<Sharded<TiedBlockImpl>> blocks;
  Sharded<TiedHeadImpl> head_unit{nullptr};
  torch::Tensor head_weight;
};
TORCH_MODULE(TiedLm);

// The same initial values on every call: initialisation draws from the
// global generator, so one caller at a time (ranks run as threads).
inline TiedLm make_tied_lm(const TiedLmOptions& o = {}) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(11);
  return TiedLm(o);
}

// Step `step`'s global batch of token sequences and next-token targets,
// from a generator of its own.
inline std::pair<torch::Tensor, torch::Tensor> tied_lm_batch(const TiedLmOptions& o, int step,
                                                            int global_batch, int seq = 5) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  auto ids = torch::randint(0, o.vocab, {global_batch, seq + 1}, gen);
  return {ids.narrow(1, 0, seq), ids.narrow(1, 1, seq).reshape({-1})};
}

}  // namespace tandem::testing
