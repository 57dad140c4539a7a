#pragma once
// A small GPT: token and position embeddings, pre-norm transformer blocks
// (causal self-attention, then a GELU MLP), a final LayerNorm and a linear
// head. Plain LibTorch nn; each block is a tandem::Sharded unit, which is the
// plain block unless the run uses ZeRO stage 3 (then each block's parameters
// are gathered around its forward and backward, one block at a time), and is
// marked tandem::Checkpointed: with activation checkpointing switched on
// (--activation-checkpointing, or the config's activation_checkpointing
// block), a block keeps only its input for backward and runs again there.

#include <cmath>

#include <torch/torch.h>

#include "tandem/parallel/activation_checkpoint.h"
#include "tandem/zero/sharded.h"

namespace gpt {

struct GptConfig {
  int64_t vocab_size = 12;
  int64_t block_size = 12;  // longest sequence
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_embd = 128;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& c) : n_head(c.n_head), n_embd(c.n_embd) {
    qkv = register_module("qkv", torch::nn::Linear(c.n_embd, 3 * c.n_embd));
    proj = register_module("proj", torch::nn::Linear(c.n_embd, c.n_embd));
    // -inf above the diagonal: position t attends to positions <= t only.
    mask = register_buffer(
        "mask", torch::full({c.block_size, c.block_size}, -INFINITY).triu(1));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), hd = n_embd / n_head;
    auto parts = qkv(x).split(n_embd, /*dim=*/2);
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head, hd}).transpose(1, 2); };
    auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    att = torch::softmax(att + mask.narrow(0, 0, t).narrow(1, 0, t), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({b, t, n_embd});
    return proj(y);
  }

  int64_t n_head, n_embd;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor mask;
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GptConfig& c) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    attn = register_module("attn", CausalSelfAttention(c));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    fc = register_module("fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
    out = register_module("out", torch::nn::Linear(4 * c.n_embd, c.n_embd));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + out(torch::gelu(fc(ln2(x))));
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Linear fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Block);

// A ZeRO-3 unit whose forward is checkpointed when switched on.
using ShardedBlock = tandem::Sharded<tandem::CheckpointedImpl<BlockImpl>>;

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c) : config(c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab_size, c.n_embd));
    pos = register_module("pos", torch::nn::Embedding(c.block_size, c.n_embd));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(ShardedBlock(c));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    head = register_module("head", torch::nn::Linear(c.n_embd, c.vocab_size));
    init_weights();
  }

  // tokens: [batch, time] int64 -> logits [batch, time, vocab]
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto positions = torch::arange(tokens.size(1), tokens.options());
    auto x = tok(tokens) + pos(positions);
    for (auto& block : *blocks) x = block->as<ShardedBlock::ContainedType>()->forward(x);
    return head(ln_f(x));
  }

  // GPT-2's initialisation: N(0, 0.02) weights, zero biases.
  void init_weights() {
    torch::NoGradGuard no_grad;
    for (auto& p : named_parameters()) {
      if (p.key().find("ln") != std::string::npos) continue;  // LayerNorm keeps 1 / 0
      if (p.key().find("bias") != std::string::npos) {
        p.value().zero_();
      } else {
        p.value().normal_(0.0, 0.02);
      }
    }
  }

  GptConfig config;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace gpt
