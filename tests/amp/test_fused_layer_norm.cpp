// fused_layer_norm on the CPU: LibTorch's fp32 layer_norm and a cast,
// bit for bit, forward and every gradient; a pre-LN block under bf16
// autocast trains exactly as with torch::nn::LayerNorm; the refusals. The
// same for fused_add_layer_norm, the residual add with the LayerNorm after
// it. The CUDA kernels run on a GPU: GpuLayerNorm.* (tests/gpu).

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/usage_error.h"
#include "tandem/amp/autocast.h"
#include "tandem/amp/fused_layer_norm.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

struct Grads {
  at::Tensor output, input, weight, bias;
};

// Forward and backward with a fixed upstream gradient; `fused` picks
// fused_layer_norm or the expression its contract names.
Grads layer_norm_run(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                     const FusedLayerNormOptions& options, bool fused) {
  auto x = x0.detach().clone().requires_grad_(true);
  at::Tensor w = w0.defined() ? w0.detach().clone().requires_grad_(w0.requires_grad()) : w0;
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : b0;
  at::Tensor y =
      fused ? fused_layer_norm(x, w, b, options)
            : at::layer_norm(x.to(torch::kFloat), {x.size(-1)}, w, b, options.eps)
                  .to(options.output_dtype.value_or(x.scalar_type()));
  torch::manual_seed(1);
  (y.to(torch::kFloat) * torch::randn(y.sizes())).sum().backward();
  return {y.detach(), x.grad(), w.defined() ? w.grad() : at::Tensor(),
          b.defined() ? b.grad() : at::Tensor()};
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || (a.scalar_type() == b.scalar_type() && torch::equal(a, b));
}

TEST(FusedLayerNorm, OnTheCpuItIsLibTorchsFp32LayerNormAndACastBitForBit) {
  torch::manual_seed(2);
  const auto w0 = torch::rand({7}) + 0.5, b0 = torch::randn({7});
  for (auto in : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (auto out : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (int affine = 0; affine < 3; ++affine) {  // 0: none, 1: both, 2: frozen weight
        SCOPED_TRACE(std::string(c10::toString(in)) + " -> " + c10::toString(out) + ", affine " +
                     std::to_string(affine));
        auto x = (torch::randn({3, 5, 7}) * 2 + 1).to(in);
        at::Tensor w = affine == 0 ? at::Tensor() : w0.clone().requires_grad_(affine == 1);
        at::Tensor b = affine == 0 ? at::Tensor() : b0.clone();
        FusedLayerNormOptions options;
        options.eps = 1e-5;
        options.output_dtype = out;
        EXPECT_FALSE(fused_layer_norm_uses_kernel(x, w, b, options));
        const auto got = layer_norm_run(x, w, b, options, true);
        const auto want = layer_norm_run(x, w, b, options, false);
        EXPECT_EQ(got.output.scalar_type(), out);
        EXPECT_EQ(got.output.sizes(), x.sizes());
        EXPECT_TRUE(same(got.output, want.output));
        EXPECT_TRUE(same(got.input, want.input));
        EXPECT_EQ(got.input.scalar_type(), in) << "the input's gradient keeps its dtype";
        EXPECT_TRUE(same(got.weight, want.weight));
        EXPECT_TRUE(same(got.bias, want.bias));
        if (affine == 2) {
          EXPECT_FALSE(got.weight.defined()) << "a frozen weight gets no gradient";
        }
      }
    }
  }
}

// The use it is for: a pre-LN block's LayerNorm feeding a Linear under bf16
// autocast. Writing bf16 rows is what the Linear's own cast did.
TEST(FusedLayerNorm, UnderCpuAutocastAPreLnBlockTrainsExactlyAsWithLayerNorm) {
  torch::manual_seed(4);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({16}));
  torch::nn::Linear fc(16, 9);
  auto x = torch::randn({4, 6, 16});
  auto run = [&](bool fused) {
    ln->zero_grad();
    fc->zero_grad();
    at::Tensor loss;
    {
      AutocastGuard autocast(c10::DeviceType::CPU, MixedPrecision::kBf16);
      at::Tensor normed;
      if (fused) {
        FusedLayerNormOptions options;
        options.output_dtype = autocast_dtype(c10::DeviceType::CPU);
        normed = fused_layer_norm(x, ln->weight, ln->bias, options);
        EXPECT_EQ(normed.scalar_type(), torch::kBFloat16);
      } else {
        normed = ln(x);
        EXPECT_EQ(normed.scalar_type(), torch::kFloat) << "autocast's layer_norm is fp32";
      }
      loss = (x + fc(normed).sum(-1, true)).pow(2).mean();
    }
    loss.backward();
    return std::vector<at::Tensor>{loss.detach(), ln->weight.grad().clone(),
                                   ln->bias.grad().clone(), fc->weight.grad().clone()};
  };
  const auto fused = run(true), plain = run(false);
  for (std::size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(torch::equal(fused[i], plain[i])) << "tensor " << i;
  }
}

TEST(FusedLayerNorm, BadInputIsRefusedWithTheFix) {
  auto x = torch::randn({4, 8});
  auto expect_refusal = [](const std::function<void()>& call, const std::string& says) {
    const std::string message = testing::usage_error_message(call);
    EXPECT_NE(message.find(says), std::string::npos) << "refusal: '" << message << "'";
  };
  expect_refusal([&] { fused_layer_norm(x, torch::ones({7}), {}); }, "pass [8]");
  expect_refusal([&] { fused_layer_norm(x, {}, torch::zeros({8, 1})); }, "bias of shape [8, 1]");
  expect_refusal([&] { fused_layer_norm(x.to(torch::kDouble), {}, {}); },
                 "pass float32, bfloat16 or float16");
  expect_refusal([&] { fused_layer_norm(torch::ones({4, 8}, torch::kInt), {}, {}); },
                 "pass float32, bfloat16 or float16");
  FusedLayerNormOptions to_double;
  to_double.output_dtype = torch::kDouble;
  expect_refusal([&] { fused_layer_norm(x, {}, {}, to_double); }, "output_dtype");
  FusedLayerNormOptions negative;
  negative.eps = -1;
  expect_refusal([&] { fused_layer_norm(x, {}, {}, negative); }, "eps is -1");
  expect_refusal([&] { fused_layer_norm(torch::randn({4, 0}), {}, {}); }, "no dimension");
  expect_refusal([&] { fused_layer_norm(at::Tensor(), {}, {}); }, "undefined");
  // The affine parameters are float32 (they were refused by ATen, without
  // the fix, as a c10::Error).
  expect_refusal([&] { fused_layer_norm(x, torch::ones({8}, torch::kBFloat16), {}); },
                 "weight is BFloat16; the LayerNorm's weight and bias must be float32");
  expect_refusal([&] { fused_layer_norm(x, {}, torch::zeros({8}, torch::kDouble)); },
                 "bias is Double");
  expect_refusal(
      [&] {
        fused_add_layer_norm(x, x, torch::ones({8}, torch::kHalf), {});
      },
      "must be float32");
}

struct AddGrads {
  at::Tensor sum, normalized, residual, delta, weight, bias;
};

// fused_add_layer_norm, or the add and the expression of fused_layer_norm's
// contract, with fixed upstream gradients; use_sum: the sum is read
// further (as the residual stream is), not only through the LayerNorm.
AddGrads add_layer_norm_run(const at::Tensor& r0, const at::Tensor& d0, const at::Tensor& w0,
                            const at::Tensor& b0, const FusedLayerNormOptions& options,
                            bool use_sum, bool fused) {
  auto r = r0.detach().clone().requires_grad_(true);
  auto d = d0.detach().clone().requires_grad_(true);
  at::Tensor w = w0.defined() ? w0.detach().clone().requires_grad_(w0.requires_grad()) : w0;
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : b0;
  at::Tensor sum, y;
  if (fused) {
    auto out = fused_add_layer_norm(r, d, w, b, options);
    sum = out.sum;
    y = out.normalized;
  } else {
    sum = r + d;
    y = at::layer_norm(sum.to(torch::kFloat), {sum.size(-1)}, w, b, options.eps)
            .to(options.output_dtype.value_or(sum.scalar_type()));
  }
  torch::manual_seed(1);
  auto loss = (y.to(torch::kFloat) * torch::randn(y.sizes())).sum();
  if (use_sum) loss = loss + (sum.to(torch::kFloat) * torch::randn(sum.sizes())).sum();
  loss.backward();
  return {sum.detach(), y.detach(), r.grad(), d.grad(),
          w.defined() ? w.grad() : at::Tensor(), b.defined() ? b.grad() : at::Tensor()};
}

TEST(FusedAddLayerNorm, OnTheCpuItIsTheAddAndLibTorchsLayerNormBitForBit) {
  torch::manual_seed(5);
  const auto w0 = torch::rand({9}) + 0.5, b0 = torch::randn({9});
  const std::vector<std::optional<at::ScalarType>> outputs = {std::nullopt, torch::kBFloat16};
  for (auto rt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (auto dt : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      for (const auto& out : outputs) {
        for (int affine = 0; affine < 3; ++affine) {  // 0: none, 1: both, 2: frozen weight
          for (bool use_sum : {false, true}) {
            SCOPED_TRACE(std::string(c10::toString(rt)) + " + " + c10::toString(dt) + " -> " +
                         (out ? c10::toString(*out) : "default") + ", affine " +
                         std::to_string(affine) + (use_sum ? ", sum read" : ""));
            auto r = (torch::randn({2, 3, 9}) * 2 + 1).to(rt);
            auto d = torch::randn({2, 3, 9}).to(dt);
            at::Tensor w = affine == 0 ? at::Tensor() : w0.clone().requires_grad_(affine == 1);
            at::Tensor b = affine == 0 ? at::Tensor() : b0.clone();
            FusedLayerNormOptions options;
            options.output_dtype = out;
            EXPECT_FALSE(fused_add_layer_norm_uses_kernel(r, d, w, b, options));
            const auto got = add_layer_norm_run(r, d, w, b, options, use_sum, true);
            const auto want = add_layer_norm_run(r, d, w, b, options, use_sum, false);
            const auto sum_dtype = at::promote_types(rt, dt);
            EXPECT_EQ(got.sum.scalar_type(), sum_dtype);
            EXPECT_EQ(got.normalized.scalar_type(), out.value_or(sum_dtype));
            EXPECT_TRUE(same(got.sum, want.sum));
            EXPECT_TRUE(same(got.normalized, want.normalized));
            EXPECT_TRUE(same(got.residual, want.residual));
            EXPECT_TRUE(same(got.delta, want.delta));
            EXPECT_EQ(got.delta.scalar_type(), dt) << "each addend's gradient keeps its dtype";
            EXPECT_TRUE(same(got.weight, want.weight));
            EXPECT_TRUE(same(got.bias, want.bias));
          }
        }
      }
    }
  }
}

// Two pre-LN sublayers under bf16 autocast, the residual stream in fp32:
// with each add fused into the LayerNorm after it, the loss and every
// gradient equal the plain block's (x = x + f(ln_1(x)); ln_2(x)).
TEST(FusedAddLayerNorm, UnderCpuAutocastTheResidualStreamTrainsExactlyAsAddThenLayerNorm) {
  torch::manual_seed(6);
  torch::nn::LayerNorm ln_1(torch::nn::LayerNormOptions({16})), ln_2(torch::nn::LayerNormOptions({16}));
  torch::nn::Linear fc(16, 16), head(16, 5);
  auto x0 = torch::randn({3, 4, 16});
  auto run = [&](bool fused) {
    for (auto* m : std::vector<torch::nn::Module*>{ln_1.get(), ln_2.get(), fc.get(), head.get()}) {
      m->zero_grad();
    }
    auto x = x0.clone().requires_grad_(true);
    at::Tensor loss;
    {
      AutocastGuard autocast(c10::DeviceType::CPU, MixedPrecision::kBf16);
      FusedLayerNormOptions options;
      options.output_dtype = autocast_dtype(c10::DeviceType::CPU);
      at::Tensor stream, normed;
      if (fused) {
        auto delta = fc(fused_layer_norm(x, ln_1->weight, ln_1->bias, options));
        EXPECT_EQ(delta.scalar_type(), torch::kBFloat16);
        auto out = fused_add_layer_norm(x, delta, ln_2->weight, ln_2->bias, options);
        stream = out.sum;
        normed = out.normalized;
      } else {
        stream = x + fc(ln_1(x));
        normed = ln_2(stream);
      }
      EXPECT_EQ(stream.scalar_type(), torch::kFloat) << "the residual stream stays fp32";
      loss = (head(normed).sum(-1) + stream.sum(-1)).pow(2).mean();
    }
    loss.backward();
    std::vector<at::Tensor> result{loss.detach(), x.grad()};
    for (auto* m : std::vector<torch::nn::Module*>{ln_1.get(), ln_2.get(), fc.get(), head.get()}) {
      for (const auto& p : m->parameters()) result.push_back(p.grad().clone());
    }
    return result;
  };
  const auto fused = run(true), plain = run(false);
  ASSERT_EQ(fused.size(), plain.size());
  for (std::size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(torch::equal(fused[i], plain[i])) << "tensor " << i;
  }
}

TEST(FusedAddLayerNorm, BadInputIsRefusedWithTheFix) {
  auto x = torch::randn({4, 8});
  auto expect_refusal = [](const std::function<void()>& call, const std::string& says) {
    const std::string message = testing::usage_error_message(call);
    EXPECT_NE(message.find(says), std::string::npos) << "refusal: '" << message << "'";
  };
  expect_refusal([&] { fused_add_layer_norm(x, torch::randn({8}), {}, {}); },
                 "the add does not broadcast, pass delta of shape [4, 8]");
  expect_refusal([&] { fused_add_layer_norm(x, x.to(torch::kDouble), {}, {}); },
                 "fused_add_layer_norm: delta is Double; pass float32, bfloat16 or float16");
  expect_refusal([&] { fused_add_layer_norm(torch::ones({4, 8}, torch::kInt), x, {}, {}); },
                 "fused_add_layer_norm: residual is Int");
  expect_refusal([&] { fused_add_layer_norm(at::Tensor(), x, {}, {}); },
                 "residual is an undefined tensor");
  expect_refusal([&] { fused_add_layer_norm(x, at::Tensor(), {}, {}); },
                 "delta is an undefined tensor");
  expect_refusal([&] { fused_add_layer_norm(x, x, torch::ones({7}), {}); },
                 "fused_add_layer_norm: weight of shape [7] for rows of 8; pass [8]");
  FusedLayerNormOptions to_double;
  to_double.output_dtype = torch::kDouble;
  expect_refusal([&] { fused_add_layer_norm(x, x, {}, {}, to_double); }, "output_dtype");
  expect_refusal([&] { fused_add_layer_norm(torch::randn({4, 0}), torch::randn({4, 0}), {}, {}); },
                 "residual of shape [4, 0] has no dimension");
}

}  // namespace
}  // namespace tandem
