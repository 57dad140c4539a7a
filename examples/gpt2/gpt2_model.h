#pragma once
// A GPT-2-class decoder in plain LibTorch: token and position embeddings,
// pre-LayerNorm blocks (causal self-attention through
// at::scaled_dot_product_attention, then a tanh-GELU MLP), a final
// LayerNorm, and an output projection tied to the token embedding. The
// parameter names follow Hugging Face's GPT-2 (wte, wpe, h.N.attn.c_attn,
// ...). bench/gpt2_reference.py is the same model in Python.

#include <cmath>
#include <string>

#include <torch/torch.h>

#include "tandem/amp/autocast.h"
#include "tandem/amp/fused_layer_norm.h"

namespace gpt2 {

struct Gpt2Config {
  int64_t vocab_size = 50304;  // GPT-2's 50257, padded to a multiple of 64
  int64_t block_size = 1024;   // context length
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  // LayerNorms through tandem::fused_layer_norm, whose output is already in
  // autocast's dtype (tandem's CUDA kernels on a GPU), instead of
  // torch::nn::LayerNorm's fp32 output that the next Linear casts.
  bool fused_layer_norm = false;
  // With fused_layer_norm: each residual add and the LayerNorm after it (the
  // next sublayer's, or the final one) as one tandem::fused_add_layer_norm.
  bool fused_residual_add = false;
};

// fused_layer_norm's options for x: its output in the dtype the next Linear
// reads (autocast's, when it is on for x's device).
inline tandem::FusedLayerNormOptions layer_norm_options(torch::nn::LayerNorm& ln,
                                                        const torch::Tensor& x) {
  tandem::FusedLayerNormOptions options;
  options.eps = ln->options.eps();
  const auto device = x.device().type();
  if (tandem::is_autocast_enabled(device)) options.output_dtype = tandem::autocast_dtype(device);
  return options;
}

// ln(x), or with fused the same rows written in the dtype the next Linear
// reads.
inline torch::Tensor layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                                bool fused) {
  if (!fused) return ln->forward(x);
  return tandem::fused_layer_norm(x, ln->weight, ln->bias, layer_norm_options(ln, x));
}

// {x + delta, ln(x + delta)} as one op (tandem::fused_add_layer_norm).
inline tandem::AddLayerNormOutput add_layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                                                 const torch::Tensor& delta) {
  return tandem::fused_add_layer_norm(x, delta, ln->weight, ln->bias, layer_norm_options(ln, x));
}

// tiny: the demo's size; small: 6 x 384; 124m: GPT-2 small.
inline Gpt2Config preset(const std::string& name) {
  if (name == "tiny") return {512, 64, 2, 4, 128};
  if (name == "small") return {50304, 256, 6, 6, 384};
  if (name == "124m") return {50304, 1024, 12, 12, 768};
  throw std::invalid_argument("unknown preset '" + name + "' (tiny, small, 124m)");
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Gpt2Config& c) : n_head(c.n_head), n_embd(c.n_embd) {
    c_attn = register_module("c_attn", torch::nn::Linear(c.n_embd, 3 * c.n_embd));
    c_proj = register_module("c_proj", torch::nn::Linear(c.n_embd, c.n_embd));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), hd = n_embd / n_head;
    auto qkv = c_attn(x).split(n_embd, /*dim=*/2);
    auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head, hd}).transpose(1, 2); };
    auto y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                              /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/true);
    return c_proj(y.transpose(1, 2).contiguous().view({b, t, n_embd}));
  }

  int64_t n_head, n_embd;
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const Gpt2Config& c) {
    c_fc = register_module("c_fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
    c_proj = register_module("c_proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj(at::gelu(c_fc(x), "tanh")); }
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Gpt2Config& c) : fused(c.fused_layer_norm) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    attn = register_module("attn", Attention(c));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    mlp = register_module("mlp", Mlp(c));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(layer_norm(ln_1, x, fused));
    return x + mlp(layer_norm(ln_2, x, fused));
  }
  // The same block with its residual adds fused into the LayerNorms after
  // them: normed is ln_1(x), computed before (by the previous block's last
  // add, or the first LayerNorm), and next_ln is the LayerNorm after this
  // block. Returns {the block's output, next_ln of it}.
  tandem::AddLayerNormOutput forward_fused_adds(const torch::Tensor& x,
                                                const torch::Tensor& normed,
                                                torch::nn::LayerNorm& next_ln) {
    const auto mid = add_layer_norm(ln_2, x, attn(normed));
    return add_layer_norm(next_ln, mid.sum, mlp(mid.normalized));
  }
  bool fused;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct Gpt2Impl : torch::nn::Module {
  explicit Gpt2Impl(const Gpt2Config& c) : config(c) {
    if (c.fused_residual_add && !c.fused_layer_norm) {
      throw std::invalid_argument(
          "Gpt2Config: fused_residual_add fuses the adds into tandem's LayerNorm; set "
          "fused_layer_norm too");
    }
    wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    init_weights();
  }

  // tokens [batch, time] int64 -> logits [batch, time, vocab]. The output
  // projection is the token embedding itself (GPT-2's weight tying): one
  // parameter, trained by both uses.
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto positions = torch::arange(tokens.size(1), tokens.options());
    auto x = wte(tokens) + wpe(positions);
    if (config.fused_residual_add && !h->is_empty()) {
      torch::Tensor normed = layer_norm(h[0]->as<BlockImpl>()->ln_1, x, true);
      for (std::size_t i = 0; i < h->size(); ++i) {
        auto& next_ln = i + 1 < h->size() ? h[i + 1]->as<BlockImpl>()->ln_1 : ln_f;
        auto out = h[i]->as<BlockImpl>()->forward_fused_adds(x, normed, next_ln);
        x = out.sum;
        normed = out.normalized;
      }
      return torch::nn::functional::linear(normed, wte->weight);
    }
    for (auto& block : *h) x = block->as<BlockImpl>()->forward(x);
    return torch::nn::functional::linear(layer_norm(ln_f, x, config.fused_layer_norm),
                                         wte->weight);
  }

  // GPT-2's initialisation: N(0, 0.02), the residual projections scaled by
  // 1/sqrt(2 * n_layer), zero biases, LayerNorm 1 / 0.
  void init_weights() {
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      if (name.find("ln_") != std::string::npos) continue;
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
        p.value().zero_();
      } else if (name.find("c_proj.weight") != std::string::npos) {
        p.value().normal_(0.0, residual_std);
      } else {
        p.value().normal_(0.0, 0.02);
      }
    }
  }

  // Parameters, the tied embedding once; without the position embedding
  // for the FLOP count (nanoGPT's and llm.c's convention).
  int64_t num_parameters(bool with_position_embedding = true) const {
    int64_t n = 0;
    for (const auto& p : parameters()) n += p.numel();
    return with_position_embedding ? n : n - wpe->weight.numel();
  }

  Gpt2Config config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Gpt2);

}  // namespace gpt2
