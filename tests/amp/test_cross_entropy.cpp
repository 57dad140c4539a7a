// fused_cross_entropy: on the CPU, LibTorch's fp32 cross-entropy exactly;
// the refusals; and the CUDA kernels' arithmetic (amp/cross_entropy_math.h)
// run here as the kernels run it, 256 threads' strided pairs joined in the
// kernels' shuffle order, against a double-precision log-sum-exp. The
// kernels themselves run on a GPU: GpuCrossEntropy.* (tests/gpu).

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "amp/cross_entropy_math.h"
#include "support/usage_error.h"
#include "tandem/amp/autocast.h"
#include "tandem/amp/cross_entropy.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

namespace F = torch::nn::functional;
namespace cem = cross_entropy_math;

struct LossAndGrad {
  at::Tensor loss, grad;
};

F::CrossEntropyFuncOptions::reduction_t aten_reduction(CrossEntropyReduction reduction) {
  if (reduction == CrossEntropyReduction::kSum) return torch::kSum;
  if (reduction == CrossEntropyReduction::kNone) return torch::kNone;
  return torch::kMean;
}

// Backward through the loss: a scalar directly, unreduced losses weighted
// by a fixed tensor (so that each row gets its own upstream gradient).
void backward_of(const at::Tensor& loss) {
  if (loss.dim() == 0) return loss.backward();
  (loss * torch::linspace(0.5, 2.0, loss.numel()).view(loss.sizes())).sum().backward();
}

LossAndGrad fused(const at::Tensor& logits, const at::Tensor& targets,
                  const CrossEntropyOptions& options) {
  auto x = logits.detach().clone().requires_grad_(true);
  auto loss = fused_cross_entropy(x, targets, options);
  backward_of(loss);
  return {loss.detach(), x.grad()};
}

LossAndGrad reference(const at::Tensor& logits, const at::Tensor& targets,
                      const CrossEntropyOptions& options) {
  auto x = logits.detach().clone().requires_grad_(true);
  const int64_t classes = logits.size(-1);
  auto loss = F::cross_entropy(x.reshape({-1, classes}).to(torch::kFloat), targets.reshape({-1}),
                               F::CrossEntropyFuncOptions()
                                   .ignore_index(options.ignore_index)
                                   .reduction(aten_reduction(options.reduction)));
  if (options.reduction == CrossEntropyReduction::kNone) loss = loss.view(targets.sizes());
  backward_of(loss);
  return {loss.detach(), x.grad()};
}

TEST(FusedCrossEntropy, OnTheCpuItIsLibTorchsFp32CrossEntropyBitForBit) {
  EXPECT_FALSE(fused_cross_entropy_uses_kernel(torch::zeros({2, 3})));
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int64_t ignore_index : {int64_t{-100}, int64_t{4}}) {
      for (auto reduction : {CrossEntropyReduction::kMean, CrossEntropyReduction::kSum,
                             CrossEntropyReduction::kNone}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " ignore_index " +
                     std::to_string(ignore_index) + " reduction " +
                     std::to_string(static_cast<int>(reduction)));
        // [batch 3, time 5, 17 classes]; a few targets ignored, one row of
        // -inf but its target.
        auto logits = (torch::randn({3, 5, 17}) * 3).to(dtype);
        logits[1][2].fill_(-std::numeric_limits<float>::infinity());
        logits[1][2][6] = 1.0;
        auto targets = torch::randint(17, {3, 5}, torch::kLong);
        targets[1][2] = 6;
        targets[0][1] = ignore_index;
        targets[2][4] = ignore_index;
        const CrossEntropyOptions options{ignore_index, reduction};
        const auto got = fused(logits, targets, options);
        const auto want = reference(logits, targets, options);
        EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
        EXPECT_EQ(got.loss.sizes(), reduction == CrossEntropyReduction::kNone
                                        ? targets.sizes()
                                        : at::IntArrayRef{});
        EXPECT_TRUE(torch::equal(got.loss, want.loss)) << got.loss << " vs " << want.loss;
        EXPECT_EQ(got.grad.scalar_type(), dtype) << "the gradient keeps the logits' dtype";
        EXPECT_TRUE(torch::equal(got.grad, want.grad));
        EXPECT_TRUE(torch::all(got.grad[0][1] == 0).item<bool>()) << "an ignored target";
      }
    }
  }
}

TEST(FusedCrossEntropy, EveryTargetIgnoredGivesNaNAsPyTorch) {
  auto logits = torch::randn({4, 9});
  auto targets = torch::full({4}, -100, torch::kLong);
  const auto got = fused(logits, targets, {});
  EXPECT_TRUE(std::isnan(got.loss.item<float>()));
  EXPECT_TRUE(std::isnan(reference(logits, targets, {}).loss.item<float>()));
}

TEST(FusedCrossEntropy, UnderCpuAutocastItTrainsTheSameLinearLayer) {
  // The use it is for: logits from a Linear under bf16 autocast.
  torch::manual_seed(5);
  torch::nn::Linear head(8, 33);
  auto input = torch::randn({6, 8});
  auto targets = torch::randint(33, {6}, torch::kLong);
  auto run = [&](bool use_fused) {
    head->zero_grad();
    at::Tensor loss;
    {
      AutocastGuard autocast(c10::DeviceType::CPU, MixedPrecision::kBf16);
      auto logits = head(input);
      EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
      loss = use_fused ? fused_cross_entropy(logits, targets) : F::cross_entropy(logits, targets);
    }
    loss.backward();
    return std::make_pair(loss.detach(), head->weight.grad().clone());
  };
  const auto [fused_loss, fused_grad] = run(true);
  const auto [aten_loss, aten_grad] = run(false);
  EXPECT_TRUE(torch::equal(fused_loss, aten_loss));
  EXPECT_TRUE(torch::equal(fused_grad, aten_grad));
}

TEST(FusedCrossEntropy, BadInputIsRefusedWithTheFix) {
  auto logits = torch::randn({4, 9});
  auto expect_refusal = [](const std::function<void()>& call, const std::string& says) {
    const std::string message = testing::usage_error_message(call);
    EXPECT_NE(message.find(says), std::string::npos) << "refusal: '" << message << "'";
  };
  expect_refusal([&] { fused_cross_entropy(logits, torch::zeros({4}, torch::kInt)); },
                 "pass int64 class indices");
  expect_refusal([&] { fused_cross_entropy(logits, torch::zeros({4, 9}, torch::kLong)); },
                 "without its last (class) dimension");
  expect_refusal([&] { fused_cross_entropy(logits.to(torch::kDouble), torch::zeros({4}, torch::kLong)); },
                 "pass float32, bfloat16 or float16 logits");
  expect_refusal([&] { fused_cross_entropy(torch::tensor(1.0f), torch::zeros({}, torch::kLong)); },
                 "no class dimension");
  expect_refusal([&] { fused_cross_entropy(at::Tensor(), torch::zeros({4}, torch::kLong)); },
                 "must both be defined");
}

// The kernels' forward, on the host: kThreads threads each take every
// kThreads-th pack of `vec` values, then warp_reduce's xor shuffles and the
// first warp's join of the 8 warps, in the kernels' order.
cem::MaxSum emulate_block(const std::vector<float>& row, int vec) {
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  std::vector<cem::MaxSum> lanes(kThreads, cem::empty_max_sum());
  const int64_t packs = static_cast<int64_t>(row.size()) / vec;
  for (int t = 0; t < kThreads; ++t) {
    for (int64_t i = t; i < packs; i += kThreads) {
      lanes[t] = cem::add_values(lanes[t], row.data() + i * vec, vec);
    }
  }
  auto warp_reduce = [](cem::MaxSum* warp) {
    for (int offset = 16; offset > 0; offset >>= 1) {
      cem::MaxSum next[32];
      for (int lane = 0; lane < 32; ++lane) {
        next[lane] = cem::combine(warp[lane], warp[lane ^ offset]);
      }
      std::copy(next, next + 32, warp);
    }
  };
  for (int w = 0; w < kWarps; ++w) warp_reduce(lanes.data() + 32 * w);
  std::vector<cem::MaxSum> first(32, cem::empty_max_sum());
  for (int w = 0; w < kWarps; ++w) first[w] = lanes[32 * w];
  warp_reduce(first.data());
  return first[0];
}

double log_sum_exp_in_double(const std::vector<float>& row) {
  double m = -std::numeric_limits<double>::infinity();
  for (float x : row) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : row) s += std::exp(static_cast<double>(x) - m);
  return m + std::log(s);
}

TEST(FusedCrossEntropyMath, AKernelBlocksStridedPairsGiveTheRowsLogSumExp) {
  torch::manual_seed(9);
  for (int64_t classes : {1, 7, 17, 64, 512, 50257, 50304}) {
    for (double spread : {1.0, 30.0}) {
      auto values = (torch::randn({classes}) * spread + 1e3 * (spread > 1)).contiguous();
      std::vector<float> row(values.data_ptr<float>(), values.data_ptr<float>() + classes);
      const double want = log_sum_exp_in_double(row);
      for (int vec : {1, 4, 8}) {
        if (classes % vec != 0) continue;  // the kernels take packs only then
        const float got = cem::log_sum_exp(emulate_block(row, vec));
        EXPECT_NEAR(got, want, 2e-6 * std::max(1.0, std::abs(want)))
            << classes << " classes, spread " << spread << ", packs of " << vec;
        // The backward's probabilities from it sum to 1.
        double total = 0;
        for (float x : row) total += cem::softmax_minus_one_hot(x, got, false);
        EXPECT_NEAR(total, 1.0, 1e-4) << classes << " classes, packs of " << vec;
      }
    }
  }
}

TEST(FusedCrossEntropyMath, NonFiniteValuesBehaveAsLogSoftmax) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto lse = [](std::vector<float> row, int vec) {
    return cem::log_sum_exp(emulate_block(row, vec));
  };
  for (int vec : {1, 8}) {
    SCOPED_TRACE("packs of " + std::to_string(vec));
    // -inf entries add nothing: the masked-out vocabulary of a model.
    std::vector<float> masked(4096, -inf);
    masked[100] = 2.0f;
    masked[3001] = 2.0f;
    EXPECT_NEAR(lse(masked, vec), 2.0 + std::log(2.0), 1e-6);
    // A row of -inf only: lse -inf (its loss is then NaN, as PyTorch's).
    EXPECT_EQ(lse(std::vector<float>(4096, -inf), vec), -inf);
    // A NaN anywhere, also among -inf only, makes the row NaN.
    std::vector<float> with_nan(4096, 0.5f);
    with_nan[777] = nan;
    EXPECT_TRUE(std::isnan(lse(with_nan, vec)));
    std::vector<float> nan_among_inf(4096, -inf);
    nan_among_inf[9] = nan;
    EXPECT_TRUE(std::isnan(lse(nan_among_inf, vec)));
    // +inf makes the row NaN, as log_softmax (inf - inf).
    std::vector<float> with_inf(4096, 0.5f);
    with_inf[13] = inf;
    EXPECT_TRUE(std::isnan(lse(with_inf, vec)));
  }
  // And a single value is its own lse, the row of one class GPT-2 never has.
  EXPECT_EQ(lse({3.5f}, 1), 3.5f);
}

}  // namespace
}  // namespace tandem
