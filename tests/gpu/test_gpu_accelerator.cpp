// The Accelerator on a GPU, and the CUDA paths of the loader and the
// unscale kernel: skipped without CUDA (scripts/gpu_kit.sh run runs them on a
// GPU machine). NCCL refuses two ranks on one GPU, so multi-rank parity runs
// Gloo on CUDA tensors, with the ranks as processes (gpu_testing.h).

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#if defined(TANDEM_WITH_NCCL)  // a CUDA LibTorch: at::cuda::sleep links
#include <ATen/cuda/Sleep.h>
#endif
#include <torch/cuda.h>
#include <torch/torch.h>

#include <limits>

#include "gpu/gpu_testing.h"
#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/loader_testing.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/amp/unscale.h"
#include "tandem/core/rank_env.h"
#include "tandem/data/distributed_loader.h"

namespace tandem {
namespace {

using testing::copy_state;
using testing::max_relative_diff;
using testing::Mlp;
using testing::run_ranks;

using testing::kHidden;
using testing::kIn;
using testing::kOut;

// The data and initial weights both sides use, from fixed seeds.
struct TwoRankCase {
  Mlp init{kIn, kHidden, kOut};
  torch::Tensor x, y;
};

TwoRankCase two_rank_case() {
  TwoRankCase c;
  torch::manual_seed(3);
  c.init = Mlp(kIn, kHidden, kOut);
  c.x = torch::randn({4, 8, kIn});
  c.y = torch::randn({4, 8, kOut});
  return c;
}

// One rank of two processes sharing the GPU: the Accelerator over Gloo.
TEST(AcceleratorCuda, Worker) {
  const std::string dir = testing::gpu_worker_dir();
  if (dir.empty()) GTEST_SKIP() << "a worker of AcceleratorCuda (launch_gpu_workers runs it)";
  const TwoRankCase c = two_rank_case();
  auto pg = ProcessGroup::init(RankEnv::from_environment());
  AcceleratorOptions options;
  options.cpu = testing::gpu_worker_device().is_cpu();
  Accelerator accelerator(pg, Config{}, options);
  Mlp model(kIn, kHidden, kOut);
  copy_state(*model, *c.init);
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  accelerator.prepare_model(model);
  auto optimizer = accelerator.prepare_optimizer(sgd);
  for (int s = 0; s < 4; ++s) {
    auto xs = c.x[s].narrow(0, pg->rank() * 4, 4).to(accelerator.device());
    auto ys = c.y[s].narrow(0, pg->rank() * 4, 4).to(accelerator.device());
    optimizer->zero_grad();
    accelerator.backward(torch::mse_loss(model->forward(xs), ys));
    optimizer->step();
  }
  testing::NamedTensors out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value();
  testing::write_worker_result(dir, "mlp", pg->rank(), out);
}

TEST(AcceleratorCuda, TwoRanksOnOneGpuMatchSingleProcessTraining) {
  TANDEM_REQUIRE_CUDA();
  const TwoRankCase c = two_rank_case();
  Mlp reference(kIn, kHidden, kOut);
  copy_state(*reference, *c.init);
  auto reference_sgd = std::make_shared<torch::optim::SGD>(
      reference->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < 4; ++s) {
    reference_sgd->zero_grad();
    torch::mse_loss(reference(c.x[s]), c.y[s]).backward();
    reference_sgd->step();
  }
  testing::ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(testing::launch_gpu_workers("AcceleratorCuda.Worker", 2, dir.path()));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_LT(max_relative_diff(testing::read_worker_result(dir.path(), "mlp", rank),
                                testing::snapshot(*reference)),
              1e-4)
        << "rank " << rank;
  }
}

TEST(AcceleratorCuda, Fp16AutocastWithTheScalerTrains) {
  TANDEM_REQUIRE_CUDA();
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

// wall_clock_breakdown on CUDA synchronises the device before each reading
// (as DeepSpeed's timers do): a kernel queued in the forward region counts
// in forward_ms although its launch returns at once.
TEST(AcceleratorCuda, WallClockBreakdownCountsAQueuedKernelInItsPart) {
  TANDEM_REQUIRE_CUDA();
#if !defined(TANDEM_WITH_NCCL)
  GTEST_SKIP() << "needs a CUDA LibTorch (at::cuda::sleep)";
#else
  run_ranks(1, [&](ProcessGroup& pg) {
    Config config;
    config.wall_clock_breakdown = true;
    config.steps_per_print = 2;
    Accelerator accelerator(pg.shared_from_this(), config);
    ASSERT_TRUE(accelerator.device().is_cuda());
    torch::manual_seed(1);
    Mlp model(kIn, kHidden, kOut);
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions(1e-3));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    auto x = torch::randn({32, kIn}).to(accelerator.device());
    auto y = x.narrow(1, 0, kOut).clone();
    for (int s = 0; s < 2; ++s) {
      optimizer->zero_grad();
      at::cuda::sleep(int64_t{100} * 1000 * 1000);  // a spin kernel: ~50 ms at 2 GHz
      accelerator.backward(torch::mse_loss(model->forward(x), y));
      optimizer->step();
    }
    const WallClockBreakdown w = accelerator.wall_clock();
    EXPECT_EQ(w.step, 2);
    EXPECT_EQ(w.steps, 2);
    // Without the synchronisation the spin would land in a later part (the
    // first one whose reading waits for the device).
    EXPECT_GE(w.forward_ms, 20.0);
    EXPECT_LT(w.backward_ms, w.forward_ms);
  });
#endif
}

// torch's fused CUDA kernel (_amp_foreach_non_finite_check_and_unscale_):
// exact products, and a NaN in a half tensor is found.
TEST(GpuKernels, UnscaleOfCudaTensorsUsesTorchsFusedKernel) {
  TANDEM_REQUIRE_CUDA();
  auto gen = at::detail::createCPUGenerator(17);
  at::Tensor g = (at::randn({4097}, gen, at::kDouble) * 1000).to(at::kFloat).cuda();
  at::Tensor h = (at::randn({33}, gen, at::kDouble) * 1000).to(at::kHalf).cuda();
  const at::Tensor want_g = g.cpu().mul(0.25f);
  EXPECT_FALSE(unscale_and_find_inf({g, h}, 0.25));
  EXPECT_TRUE(torch::equal(g.cpu(), want_g));
  h[32] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(unscale_and_find_inf({g, h}, 0.25));
}

// Batches for a CUDA device arrive pinned-and-copied (non_blocking, with
// prefetch), equal to the CPU loader's.
TEST(GpuKernels, LoaderBatchesArriveOnTheGpuEqualToCpuOnes) {
  TANDEM_REQUIRE_CUDA();
  const at::Tensor x = at::arange(37, at::kLong);
  DistributedLoaderOptions cpu_options;
  cpu_options.batch_size = 4;
  cpu_options.seed = 9;
  DistributedLoader cpu({x}, 2, 1, cpu_options);
  DistributedLoaderOptions options = cpu_options;
  options.prefetch = 2;
  options.device = c10::Device(c10::kCUDA, 0);
  options.pin_memory = true;
  options.non_blocking = true;
  DistributedLoader gpu({x}, 2, 1, options);
  std::vector<std::vector<int64_t>> got;
  for (auto& batch : gpu) {
    ASSERT_TRUE(batch[0].is_cuda());
    // The device-to-host copy runs on the stream the upload used: ordered.
    got.push_back(testing::values(batch[0]));
  }
  EXPECT_EQ(got, testing::drain(cpu));
}

}  // namespace
}  // namespace tandem
