// fused_layer_norm on the CPU: LibTorch's fp32 layer_norm and a cast,
// bit for bit, forward and every gradient; a pre-LN block under bf16
// autocast trains exactly as with torch::nn::LayerNorm; the refusals. The
// CUDA kernels run on a GPU: GpuLayerNorm.* (tests/gpu).

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
}

}  // namespace
}  // namespace tandem
