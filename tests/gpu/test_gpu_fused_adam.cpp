// The fused Adam/AdamW step (src/optim/fused_adam.h) on CUDA against
// LibTorch's own per-parameter loop on the same GPU, and the time of each
// for a model of many small parameters (a GPT's shape: where a step is bound
// by launches).

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "optim/fused_adam.h"

namespace tandem::detail {
namespace {

// `count` parameters of odd sizes on the GPU, from a fixed seed.
std::vector<torch::Tensor> make_params(int count) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> params;
  for (int i = 0; i < count; ++i) {
    params.push_back(torch::randn({1 + (i * 37) % 129, 1 + (i * 11) % 61},
                                  torch::Device(torch::kCUDA, 0))
                         .requires_grad_());
  }
  return params;
}

std::vector<torch::Tensor> clone(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

void set_grads(std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(1000 + step);
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
}

TEST(GpuFusedAdam, MatchesLibTorchsLoopOnTheGpuAndTakesFewerLaunches) {
  TANDEM_REQUIRE_CUDA();
  constexpr int kParams = 60, kSteps = 50, kTimed = 200;
  auto fused = make_params(kParams);
  auto plain = clone(fused);
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  torch::optim::AdamW fused_opt(fused, options), plain_opt(plain, options);
  for (int k = 0; k < kSteps; ++k) {
    set_grads(fused, k);
    set_grads(plain, k);
    ASSERT_TRUE(try_fused_adam_step(fused_opt)) << "CUDA parameters should take the fused path";
    plain_opt.step();
  }
  double worst = 0;
  for (int i = 0; i < kParams; ++i) {
    const double scale = std::max(1e-3, plain[i].abs().max().item<double>());
    worst = std::max(worst, (fused[i] - plain[i]).abs().max().item<double>() / scale);
  }
  EXPECT_LT(worst, 1e-5);

  const double fused_ms =
      testing::gpu_ms_per_call(5, kTimed, [&] { try_fused_adam_step(fused_opt); });
  const double plain_ms = testing::gpu_ms_per_call(5, kTimed, [&] { plain_opt.step(); });
  testing::record_gpu_figures("fused_adamw_step",
                              {{"parameters", kParams},
                               {"max_rel_diff_after_50_steps", worst},
                               {"fused_ms", fused_ms},
                               {"libtorch_loop_ms", plain_ms},
                               {"speedup", plain_ms / fused_ms}});
}

}  // namespace
}  // namespace tandem::detail
