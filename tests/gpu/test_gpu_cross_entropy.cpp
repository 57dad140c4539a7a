// fused_cross_entropy's CUDA kernels against LibTorch's cross-entropy on the
// same GPU: the loss of the fp32 copy of the logits, and its gradient cast
// back to the logits' dtype (what autocast's path gives). float32, bfloat16
// and float16 logits; mean, sum and unreduced losses; GPT-2's padded
// vocabulary (16-byte packs), its odd one (one value at a time), a small and
// a single class; ignored targets, a row with -inf logits, an upstream
// gradient of a loss scale. The loss
// agrees within 1e-5 relative (fp32 sums in another order); each bf16 and
// fp16 gradient value within one unit in the last place, fp32 ones within
// 1e-5 relative, and the figures count the bit-equal ones. Then the speed of
// both on GPT-2 124m's logits.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "tandem/amp/cross_entropy.h"

namespace tandem {
namespace {

namespace F = torch::nn::functional;

struct LossAndGrad {
  at::Tensor loss, grad;
};

// upstream: the scalar's gradient, or for unreduced losses a ramp from 0.5
// to 2 times it, one value per row.
LossAndGrad run(const at::Tensor& logits, const at::Tensor& targets,
                CrossEntropyReduction reduction, double upstream, bool fused) {
  auto x = logits.detach().clone().requires_grad_(true);
  at::Tensor loss;
  if (fused) {
    CrossEntropyOptions options;
    options.reduction = reduction;
    loss = fused_cross_entropy(x, targets, options);
  } else {
    F::CrossEntropyFuncOptions options;
    if (reduction == CrossEntropyReduction::kSum) options.reduction(torch::kSum);
    if (reduction == CrossEntropyReduction::kNone) options.reduction(torch::kNone);
    loss = F::cross_entropy(x.to(torch::kFloat), targets, options);
  }
  if (loss.dim() == 0) {
    (loss * upstream).backward();
  } else {
    (loss * torch::linspace(0.5, 2.0, loss.numel(), loss.options()) * upstream).sum().backward();
  }
  return {loss.detach(), x.grad()};
}

// One unit in the last place of the reference, or, for float32 where
// rounding hides nothing, 1e-5 of it: the log-sum-exp of ~50k values summed
// in another order differs by a few units, and every probability with it.
at::Tensor gradient_tolerance(const at::Tensor& want, torch::ScalarType dtype) {
  return torch::maximum(testing::unit_in_last_place(want, dtype), want.abs() * 1e-5) + 1e-30;
}

struct ParityCase {
  torch::ScalarType dtype;
  int64_t classes;
  CrossEntropyReduction reduction;
  double upstream;

  std::string name() const {
    const char* reduced = reduction == CrossEntropyReduction::kMean  ? "mean"
                          : reduction == CrossEntropyReduction::kSum ? "sum"
                                                                      : "none";
    return std::string(c10::toString(dtype)) + "_" + std::to_string(classes) + "_" + reduced +
           "_x" + std::to_string(static_cast<int64_t>(upstream));
  }
};

// 37 rows, every fifth target ignored, row 3 all -inf but its target; the
// figures of the case into `figures`.
void check_parity(const ParityCase& c, nlohmann::json& figures) {
  SCOPED_TRACE(c.name());
  const auto device = torch::Device(torch::kCUDA);
  const int64_t rows = 37;
  const auto ignored_rows = torch::arange(0, rows, 5, torch::kLong);
  auto logits = (torch::randn({rows, c.classes}, device) * 3).to(c.dtype);
  auto targets = torch::randint(c.classes, {rows}, torch::dtype(torch::kLong).device(device));
  targets.index_put_({ignored_rows}, -100);
  if (c.classes > 4) {
    logits[3].fill_(-std::numeric_limits<float>::infinity());
    logits[3][2] = 0.5;
    targets[3] = 2;
  }
  ASSERT_TRUE(fused_cross_entropy_uses_kernel(logits));
  const auto got = run(logits, targets, c.reduction, c.upstream, true);
  const auto want = run(logits, targets, c.reduction, c.upstream, false);
  ASSERT_EQ(got.loss.sizes(), want.loss.sizes());
  const auto want_loss = want.loss.to(torch::kDouble);
  const double loss_diff = ((got.loss.to(torch::kDouble) - want_loss).abs() /
                            want_loss.abs().clamp_min(1e-12))
                               .max()
                               .item<double>();
  EXPECT_LT(loss_diff, 1e-5) << "largest relative loss difference";
  ASSERT_EQ(got.grad.scalar_type(), c.dtype);
  const auto g = got.grad.to(torch::kDouble), w = want.grad.to(torch::kDouble);
  const auto off = (g - w).abs();
  EXPECT_TRUE((off <= gradient_tolerance(w, c.dtype)).all().item<bool>())
      << "largest gradient difference " << off.max().item<double>();
  EXPECT_TRUE(got.grad.index({ignored_rows}).eq(0).all().item<bool>())
      << "ignored rows get zero gradients";
  figures[c.name()] = {{"loss_relative_diff", loss_diff},
                       {"grad_bit_equal", g.eq(w).to(torch::kDouble).mean().item<double>()}};
}

TEST(GpuCrossEntropy, FusedKernelsMatchLibTorchsCrossEntropy) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_TRUE(built_with_cuda_kernels())
      << "the library was built without its CUDA kernels (no nvcc at configure time?)";
  torch::manual_seed(17);
  nlohmann::json figures;
  for (auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    for (int64_t classes : {50304, 50257, 17, 1}) {
      check_parity({dtype, classes, CrossEntropyReduction::kMean, 1.0}, figures);
      check_parity({dtype, classes, CrossEntropyReduction::kMean, 65536.0}, figures);
      check_parity({dtype, classes, CrossEntropyReduction::kSum, 1.0}, figures);
      check_parity({dtype, classes, CrossEntropyReduction::kNone, 1.0}, figures);
    }
  }
  // Every target ignored: NaN, as PyTorch.
  auto logits = torch::randn({4, 64}, torch::Device(torch::kCUDA)).to(torch::kBFloat16);
  auto ignored = torch::full({4}, -100, torch::dtype(torch::kLong).device(torch::kCUDA));
  EXPECT_TRUE(std::isnan(fused_cross_entropy(logits, ignored).item<float>()));
  testing::record_gpu_figures("fused_cross_entropy_parity", figures);
}

// GPT-2 124m's loss at batch 16 x 1024 (16384 rows of 50304 bf16 logits):
// forward and backward of the fused loss against autocast's path, on the
// same GPU. A figure, not a goal: docs/performance.md reads it.
TEST(GpuCrossEntropy, SpeedOnGpt2SmallsLogits) {
  TANDEM_REQUIRE_CUDA();
  if (!built_with_cuda_kernels()) GTEST_SKIP() << "built without tandem's CUDA kernels";
  const auto device = torch::Device(torch::kCUDA);
  auto logits = torch::randn({16384, 50304}, device).to(torch::kBFloat16).requires_grad_(true);
  auto targets = torch::randint(50304, {16384}, torch::dtype(torch::kLong).device(device));
  auto step = [&](bool fused) {
    return [&, fused] {
      logits.mutable_grad() = at::Tensor();
      at::Tensor loss = fused ? fused_cross_entropy(logits, targets)
                              : F::cross_entropy(logits.to(torch::kFloat), targets);
      loss.backward();
    };
  };
  const double fused_ms = testing::gpu_ms_per_call(3, 20, step(true));
  const double aten_ms = testing::gpu_ms_per_call(3, 20, step(false));
  torch::cuda::synchronize();
  testing::record_gpu_figures("fused_cross_entropy_speed",
                              {{"rows", 16384},
                               {"classes", 50304},
                               {"fused_ms", fused_ms},
                               {"aten_fp32_ms", aten_ms},
                               {"speedup", aten_ms / fused_ms}});
  EXPECT_GT(fused_ms, 0);
}

}  // namespace
}  // namespace tandem
