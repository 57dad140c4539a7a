// The Accelerator on a GPU: skipped without CUDA. On a GPU machine
// `ctest -L gpu` (scripts/gpu_check.sh) runs them. NCCL refuses two ranks on
// one GPU, so multi-rank parity runs Gloo on CUDA tensors.

#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "accelerate/accelerator_testing.h"
#include "parallel/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

using testing::copy_state;
using testing::max_relative_diff;
using testing::Mlp;
using testing::run_ranks;

using testing::kHidden;
using testing::kIn;
using testing::kOut;

TEST(AcceleratorCuda, TwoRanksOnOneGpuMatchSingleProcessTraining) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  torch::manual_seed(3);
  const Mlp init(kIn, kHidden, kOut);
  const auto x = torch::randn({4, 8, kIn}), y = torch::randn({4, 8, kOut});
  Mlp reference(kIn, kHidden, kOut);
  copy_state(*reference, *init);
  auto reference_sgd = std::make_shared<torch::optim::SGD>(
      reference->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < 4; ++s) {
    reference_sgd->zero_grad();
    torch::mse_loss(reference(x[s]), y[s]).backward();
    reference_sgd->step();
  }
  ProcessGroupOptions options;
  options.cuda_backend = CudaBackend::kGloo;
  run_ranks(
      2,
      [&](ProcessGroup& pg) {
        Accelerator accelerator(pg.shared_from_this(), Config{});
        ASSERT_TRUE(accelerator.device().is_cuda());
        Mlp model(kIn, kHidden, kOut);
        copy_state(*model, *init);
        auto sgd = std::make_shared<torch::optim::SGD>(
            model->parameters(), torch::optim::SGDOptions(0.1));
        accelerator.prepare_model(model);
        auto optimizer = accelerator.prepare_optimizer(sgd);
        for (int s = 0; s < 4; ++s) {
          auto xs = x[s].narrow(0, pg.rank() * 4, 4).to(accelerator.device());
          auto ys = y[s].narrow(0, pg.rank() * 4, 4).to(accelerator.device());
          optimizer->zero_grad();
          accelerator.backward(torch::mse_loss(model->forward(xs), ys));
          optimizer->step();
        }
        model->to(torch::kCPU);
        EXPECT_LT(max_relative_diff(*model, *reference), 1e-4);
      },
      options);
}

TEST(AcceleratorCuda, Fp16AutocastWithTheScalerTrains) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  run_ranks(1, [&](ProcessGroup& pg) {
    Config config;
    config.mixed_precision = MixedPrecision::kFp16;
    Accelerator accelerator(pg.shared_from_this(), config);
    EXPECT_EQ(accelerator.loss_scale(), 65536.0);
    torch::manual_seed(1);
    Mlp model(kIn, kHidden, kOut);
    auto adam = std::make_shared<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    auto x = torch::randn({32, kIn}).to(accelerator.device());
    auto y = x.narrow(1, 0, kOut).clone();
    double first = 0, last = 0;
    for (int s = 0; s < 200; ++s) {
      optimizer->zero_grad();
      torch::Tensor out, loss;
      {
        auto autocast = accelerator.autocast();
        out = model->forward(x);
        loss = torch::mse_loss(out, y);
      }
      EXPECT_EQ(out.scalar_type(), torch::kHalf);
      accelerator.backward(loss);
      optimizer->step();
      (s == 0 ? first : last) = loss.item<double>();
    }
    EXPECT_LT(last, 0.5 * first);
    EXPECT_GT(accelerator.step(), 150);
  });
}

}  // namespace
}  // namespace tandem
