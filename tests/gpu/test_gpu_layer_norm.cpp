// fused_layer_norm's CUDA kernels against LibTorch on the same GPU: the
// expression of its contract, at::layer_norm of the fp32 input cast to the
// output dtype, forward and every gradient. Every (input, output) pair the
// kernels take; GPT-2's width 768, odd widths (1, 33, 4097); 1, 37 and
// 16384 rows; with and without weight and bias, and a frozen weight. The
// output within one unit in the last place of its dtype (fp32: 1e-5 of the
// largest value); each gradient within 1e-4 of its largest value plus one
// unit in the last place (LibTorch's Welford statistics and its formula's
// order against tandem's two passes); the figures count the bit-equal
// outputs. Then both timed on GPT-2 124m's 25 LayerNorms of [16384, 768].
// The same for fused_add_layer_norm against the add and that expression,
// with and without a gradient reaching the sum directly, and timed on
// 124m's 24 residual adds with the LayerNorms after them.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "tandem/amp/cross_entropy.h"
#include "tandem/amp/fused_layer_norm.h"

namespace tandem {
namespace {

struct Result {
  at::Tensor output, input, weight, bias;
};

Result run_layer_norm(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0,
                      at::ScalarType out, const at::Tensor& upstream, bool fused) {
  auto x = x0.detach().clone().requires_grad_(true);
  at::Tensor w = w0.defined() ? w0.detach().clone().requires_grad_(w0.requires_grad()) : w0;
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : b0;
  FusedLayerNormOptions options;
  options.output_dtype = out;
  at::Tensor y = fused ? fused_layer_norm(x, w, b, options)
                       : at::layer_norm(x.to(torch::kFloat), {x.size(-1)}, w, b, 1e-5).to(out);
  y.backward(upstream.to(out));
  return {y.detach(), x.grad(), w.defined() ? w.grad() : at::Tensor(),
          b.defined() ? b.grad() : at::Tensor()};
}

// |got - want| <= ulp(want) + relative * max|want|, elementwise.
void expect_close(const at::Tensor& got, const at::Tensor& want, double relative,
                  const std::string& what) {
  ASSERT_EQ(got.defined(), want.defined()) << what;
  if (!want.defined()) return;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  const auto off = (g - w).abs();
  const auto bound = testing::unit_in_last_place(w, want.scalar_type()) +
                     relative * w.abs().max().item<double>() + 1e-30;
  EXPECT_TRUE((off <= bound).all().item<bool>())
      << what << ": largest difference " << off.max().item<double>() << " (largest value "
      << w.abs().max().item<double>() << ")";
}

// The (input, output) dtype pairs the kernels take.
std::vector<std::pair<at::ScalarType, at::ScalarType>> kernel_dtype_pairs() {
  return {{torch::kFloat, torch::kFloat},
          {torch::kFloat, torch::kBFloat16},
          {torch::kFloat, torch::kHalf},
          {torch::kBFloat16, torch::kBFloat16},
          {torch::kHalf, torch::kHalf}};
}

// rows x columns: GPT-2's width at its batch and at an odd row count, odd
// widths, a single row, a single column.
constexpr std::pair<int64_t, int64_t> kShapes[] = {
    {16384, 768}, {37, 768}, {37, 33}, {1, 4097}, {37, 1}};

// affine: 0 none, 1 weight and bias, 2 a frozen weight.
std::string case_name(at::ScalarType first, const char* joiner, at::ScalarType second,
                      int64_t rows, int64_t columns, int affine) {
  return std::string(c10::toString(first)) + joiner + c10::toString(second) + "_" +
         std::to_string(rows) + "x" + std::to_string(columns) +
         (affine == 0 ? "_plain" : affine == 1 ? "_affine" : "_frozen");
}

double bit_equal_fraction(const at::Tensor& got, const at::Tensor& want) {
  return got.to(torch::kDouble).eq(want.to(torch::kDouble)).to(torch::kDouble).mean()
      .item<double>();
}

TEST(GpuLayerNorm, FusedKernelsMatchLibTorchsLayerNorm) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_TRUE(built_with_cuda_kernels())
      << "the library was built without its CUDA kernels (no nvcc at configure time?)";
  const auto device = torch::Device(torch::kCUDA);
  torch::manual_seed(23);
  nlohmann::json figures;
  for (const auto& [in, out] : kernel_dtype_pairs()) {
    for (const auto& [rows, columns] : kShapes) {
      for (int affine = 0; affine < 3; ++affine) {  // 0: none, 1: both, 2: frozen weight
        const std::string name = case_name(in, "_to_", out, rows, columns, affine);
        SCOPED_TRACE(name);
        auto x = (torch::randn({rows, columns}, device) * 3 + 0.5).to(in);
        at::Tensor w, b;
        if (affine > 0) {
          w = (torch::rand({columns}, device) + 0.5).requires_grad_(affine == 1);
          b = torch::randn({columns}, device);
        }
        auto upstream = torch::randn({rows, columns}, device);
        FusedLayerNormOptions options;
        options.output_dtype = out;
        ASSERT_TRUE(fused_layer_norm_uses_kernel(x, w, b, options));
        const auto got = run_layer_norm(x, w, b, out, upstream, true);
        const auto want = run_layer_norm(x, w, b, out, upstream, false);
        expect_close(got.output, want.output, out == torch::kFloat ? 1e-5 : 0.0, "output");
        expect_close(got.input, want.input, 1e-4, "input gradient");
        expect_close(got.weight, want.weight, 1e-4, "weight gradient");
        expect_close(got.bias, want.bias, 1e-4, "bias gradient");
        figures[name] = {{"output_bit_equal", bit_equal_fraction(got.output, want.output)}};
      }
    }
  }
  testing::record_gpu_figures("fused_layer_norm_parity", figures);
}

struct AddResult {
  at::Tensor sum, output, residual, delta, weight, bias;
};

// Which gradients flow: an upstream gradient reaches the sum directly (the
// residual stream read further) and/or the normalised rows, where defined;
// the addends are trained or frozen.
struct GradientPattern {
  at::Tensor sum_upstream, upstream;
  bool residual_trained = true, delta_trained = true;
};

AddResult run_add_layer_norm(const at::Tensor& r0, const at::Tensor& d0, const at::Tensor& w0,
                             const at::Tensor& b0, const GradientPattern& pattern, bool fused) {
  auto r = r0.detach().clone().requires_grad_(pattern.residual_trained);
  auto d = d0.detach().clone().requires_grad_(pattern.delta_trained);
  at::Tensor w = w0.defined() ? w0.detach().clone().requires_grad_(w0.requires_grad()) : w0;
  at::Tensor b = b0.defined() ? b0.detach().clone().requires_grad_(true) : b0;
  const auto out = d0.scalar_type();
  at::Tensor sum, y;
  if (fused) {
    FusedLayerNormOptions options;
    options.output_dtype = out;
    auto both = fused_add_layer_norm(r, d, w, b, options);
    sum = both.sum;
    y = both.normalized;
  } else {
    sum = r + d;
    y = at::layer_norm(sum.to(torch::kFloat), {sum.size(-1)}, w, b, 1e-5).to(out);
  }
  std::vector<at::Tensor> outputs, upstreams;
  if (pattern.sum_upstream.defined()) {
    outputs.push_back(sum);
    upstreams.push_back(pattern.sum_upstream.to(sum.scalar_type()));
  }
  if (pattern.upstream.defined()) {
    outputs.push_back(y);
    upstreams.push_back(pattern.upstream.to(out));
  }
  torch::autograd::backward(outputs, upstreams);
  return {sum.detach(), y.detach(),  r.grad(), d.grad(), w.defined() ? w.grad() : at::Tensor(),
          b.defined() ? b.grad() : at::Tensor()};
}

// The half types' unit roundoff: LibTorch rounds the LayerNorm's input
// gradient to the residual's dtype before adding the sum's own gradient,
// the kernel rounds the total once.
double double_rounding(at::ScalarType t) {
  return t == torch::kBFloat16 ? 0x1p-8 : t == torch::kHalf ? 0x1p-11 : 0.0;
}

TEST(GpuLayerNorm, FusedAddKernelsMatchLibTorchsAddAndLayerNorm) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_TRUE(built_with_cuda_kernels())
      << "the library was built without its CUDA kernels (no nvcc at configure time?)";
  const auto device = torch::Device(torch::kCUDA);
  // (residual, delta) pairs: the normalised rows are written in delta's dtype.
  torch::manual_seed(29);
  nlohmann::json figures;
  for (const auto& [rt, dt] : kernel_dtype_pairs()) {
    for (const auto& [rows, columns] : kShapes) {
      for (int affine = 0; affine < 3; ++affine) {  // 0: none, 1: both, 2: frozen weight
        for (bool sum_read : {false, true}) {
          const std::string name =
              case_name(rt, "_plus_", dt, rows, columns, affine) + (sum_read ? "_sum_read" : "");
          SCOPED_TRACE(name);
          auto r = (torch::randn({rows, columns}, device) * 3 + 0.5).to(rt);
          auto d = torch::randn({rows, columns}, device).to(dt);
          at::Tensor w, b;
          if (affine > 0) {
            w = (torch::rand({columns}, device) + 0.5).requires_grad_(affine == 1);
            b = torch::randn({columns}, device);
          }
          GradientPattern pattern;
          pattern.upstream = torch::randn({rows, columns}, device);
          if (sum_read) pattern.sum_upstream = torch::randn({rows, columns}, device);
          FusedLayerNormOptions options;
          options.output_dtype = dt;
          ASSERT_TRUE(fused_add_layer_norm_uses_kernel(r, d, w, b, options));
          const auto got = run_add_layer_norm(r, d, w, b, pattern, true);
          const auto want = run_add_layer_norm(r, d, w, b, pattern, false);
          EXPECT_TRUE(torch::equal(got.sum, want.sum)) << "the add, in fp32 and rounded once";
          expect_close(got.output, want.output, dt == torch::kFloat ? 1e-5 : 0.0, "output");
          const double slack = sum_read ? double_rounding(rt) : 0.0;
          expect_close(got.residual, want.residual, 1e-4 + slack, "residual gradient");
          expect_close(got.delta, want.delta, 1e-4 + slack, "delta gradient");
          expect_close(got.weight, want.weight, 1e-4, "weight gradient");
          expect_close(got.bias, want.bias, 1e-4, "bias gradient");
          figures[name] = {{"output_bit_equal", bit_equal_fraction(got.output, want.output)}};
        }
      }
    }
  }
  testing::record_gpu_figures("fused_add_layer_norm_parity", figures);
}

// The other ways gradients flow, on a [4, 37, 768] batch (three
// dimensions, reshaped to rows and back): only the sum read (the
// LayerNorm's output unused, so its backward is the add's own), a frozen
// residual, a frozen delta; fp32 + bf16 and bf16 + bf16.
TEST(GpuLayerNorm, FusedAddTakesEveryWayGradientsFlow) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_TRUE(built_with_cuda_kernels());
  const auto device = torch::Device(torch::kCUDA);
  torch::manual_seed(31);
  const std::vector<int64_t> shape = {4, 37, 768};
  for (auto rt : {torch::kFloat, torch::kBFloat16}) {
    auto r = (torch::randn(shape, device) * 3 + 0.5).to(rt);
    auto d = torch::randn(shape, device).to(torch::kBFloat16);
    auto w = (torch::rand({768}, device) + 0.5).requires_grad_(true);
    auto b = torch::randn({768}, device);
    for (int way = 0; way < 3; ++way) {  // 0: only the sum read; 1: frozen residual; 2: frozen delta
      SCOPED_TRACE(std::string(c10::toString(rt)) + ", way " + std::to_string(way));
      GradientPattern pattern;
      pattern.sum_upstream = torch::randn(shape, device);
      if (way > 0) pattern.upstream = torch::randn(shape, device);
      pattern.residual_trained = way != 1;
      pattern.delta_trained = way != 2;
      const auto got = run_add_layer_norm(r, d, w, b, pattern, true);
      const auto want = run_add_layer_norm(r, d, w, b, pattern, false);
      EXPECT_EQ(got.sum.sizes(), r.sizes());
      EXPECT_EQ(got.output.sizes(), r.sizes());
      EXPECT_TRUE(torch::equal(got.sum, want.sum));
      expect_close(got.output, want.output, 0.0, "output");
      const double slack = way > 0 ? double_rounding(rt) : 0.0;
      expect_close(got.residual, want.residual, 1e-4 + slack, "residual gradient");
      expect_close(got.delta, want.delta, 1e-4 + slack, "delta gradient");
      expect_close(got.weight, want.weight, 1e-4, "weight gradient");
      expect_close(got.bias, want.bias, 1e-4, "bias gradient");
      if (way == 0) {
        EXPECT_FALSE(got.weight.defined()) << "no gradient reaches the LayerNorm's weight";
        EXPECT_TRUE(torch::equal(got.residual, want.residual)) << "the add's backward, exactly";
        EXPECT_TRUE(torch::equal(got.delta, want.delta));
      }
    }
  }
}

// GPT-2 124m's 25 LayerNorms at batch 16 x 1024 under bf16 autocast: the
// fp32 residual in, bf16 rows out, forward and backward, against
// layer_norm's fp32 output and the Linear's cast (and the cast's backward).
TEST(GpuLayerNorm, SpeedOnGpt2SmallsLayerNorms) {
  TANDEM_REQUIRE_CUDA();
  if (!built_with_cuda_kernels()) GTEST_SKIP() << "built without tandem's CUDA kernels";
  const auto device = torch::Device(torch::kCUDA);
  auto x = torch::randn({16384, 768}, device).requires_grad_(true);
  auto w = torch::ones({768}, device).requires_grad_(true);
  auto b = torch::zeros({768}, device).requires_grad_(true);
  auto upstream = torch::randn({16384, 768}, device).to(torch::kBFloat16);
  FusedLayerNormOptions options;
  options.output_dtype = torch::kBFloat16;
  auto passes = [&](bool fused) {
    return [&, fused] {
      for (int i = 0; i < 25; ++i) {
        for (auto* t : {&x, &w, &b}) t->mutable_grad() = at::Tensor();  // adopted, not added
        at::Tensor y = fused ? fused_layer_norm(x, w, b, options)
                             : at::layer_norm(x, {768}, w, b, 1e-5).to(torch::kBFloat16);
        y.backward(upstream);
      }
    };
  };
  const double fused_ms = testing::gpu_ms_per_call(2, 10, passes(true));
  const double aten_ms = testing::gpu_ms_per_call(2, 10, passes(false));
  testing::record_gpu_figures("fused_layer_norm_speed", {{"layer_norms", 25},
                                                         {"rows", 16384},
                                                         {"columns", 768},
                                                         {"fused_ms", fused_ms},
                                                         {"aten_fp32_ms", aten_ms},
                                                         {"speedup", aten_ms / fused_ms}});
  EXPECT_GT(fused_ms, 0);
}

// GPT-2 124m's 24 residual adds at batch 16 x 1024 under bf16 autocast, each
// with the LayerNorm after it: the fp32 residual and a bf16 sublayer output
// in, the fp32 sum and bf16 rows out, forward and backward (the sum's own
// gradient arriving too), fused against the add and fused_layer_norm apart,
// and against the add and LibTorch's fp32 layer_norm with the Linear's cast.
TEST(GpuLayerNorm, SpeedOfTheResidualAddsWithTheirLayerNormsOnGpt2Small) {
  TANDEM_REQUIRE_CUDA();
  if (!built_with_cuda_kernels()) GTEST_SKIP() << "built without tandem's CUDA kernels";
  const auto device = torch::Device(torch::kCUDA);
  auto x = torch::randn({16384, 768}, device).requires_grad_(true);
  auto delta = torch::randn({16384, 768}, device).to(torch::kBFloat16).requires_grad_(true);
  auto w = torch::ones({768}, device).requires_grad_(true);
  auto b = torch::zeros({768}, device).requires_grad_(true);
  auto upstream = torch::randn({16384, 768}, device).to(torch::kBFloat16);
  auto sum_upstream = torch::randn({16384, 768}, device);
  FusedLayerNormOptions options;
  options.output_dtype = torch::kBFloat16;
  enum class Way { kFused, kAddApart, kAten };
  auto passes = [&](Way way) {
    return [&, way] {
      for (int i = 0; i < 24; ++i) {
        for (auto* t : {&x, &delta, &w, &b}) t->mutable_grad() = at::Tensor();
        at::Tensor sum, y;
        if (way == Way::kFused) {
          auto out = fused_add_layer_norm(x, delta, w, b, options);
          sum = out.sum;
          y = out.normalized;
        } else {
          sum = x + delta;
          y = way == Way::kAddApart
                  ? fused_layer_norm(sum, w, b, options)
                  : at::layer_norm(sum, {768}, w, b, 1e-5).to(torch::kBFloat16);
        }
        torch::autograd::backward({sum, y}, {sum_upstream, upstream});
      }
    };
  };
  const double fused_ms = testing::gpu_ms_per_call(2, 10, passes(Way::kFused));
  const double apart_ms = testing::gpu_ms_per_call(2, 10, passes(Way::kAddApart));
  const double aten_ms = testing::gpu_ms_per_call(2, 10, passes(Way::kAten));
  testing::record_gpu_figures("fused_add_layer_norm_speed",
                              {{"adds", 24},
                               {"rows", 16384},
                               {"columns", 768},
                               {"fused_ms", fused_ms},
                               {"add_then_fused_layer_norm_ms", apart_ms},
                               {"add_then_aten_fp32_ms", aten_ms},
                               {"speedup_over_apart", apart_ms / fused_ms},
                               {"speedup_over_aten", aten_ms / fused_ms}});
  EXPECT_GT(fused_ms, 0);
}

}  // namespace
}  // namespace tandem
