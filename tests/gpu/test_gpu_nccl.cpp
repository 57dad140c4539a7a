// 4.1 NCCL at world 1: every collective tandem offers on CUDA tensors, a
// timeout that fires and names the operation, and DDP through NCCL equal to
// plain single-process training on the same GPU. NCCL refuses two ranks on
// one device, so world 1 is what one GPU can check; run_ranks makes a real
// (non-local) group, so every call goes through ProcessGroupNCCL.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/ddp_test_models.h"
#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/parallel/ddp.h"

#if defined(TANDEM_WITH_NCCL)
#include <ATen/cuda/Sleep.h>
#endif

namespace tandem {
namespace gpu_nccl_test {

#if defined(TANDEM_WITH_NCCL)
#define TANDEM_REQUIRE_NCCL() TANDEM_REQUIRE_CUDA()
#else
#define TANDEM_REQUIRE_NCCL() GTEST_SKIP() << "this LibTorch has no NCCL (a CPU build)"
#endif

ProcessGroupOptions nccl_options() {
  ProcessGroupOptions options;
  options.cuda_backend = CudaBackend::kNccl;
  return options;
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.is_cuda()) << what;
  EXPECT_TRUE(torch::equal(got.cpu(), want.cpu())) << what;
}

TEST(NcclWorld1, EveryCollectiveOnCudaTensorsGivesTheSingleRankResult) {
  TANDEM_REQUIRE_NCCL();
  testing::run_ranks(
      1,
      [](ProcessGroup& pg) {
        const torch::Device cuda(torch::kCUDA, 0);
        for (auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kLong}) {
          for (int64_t n : {1, 7, 1001}) {
            const std::string what = std::string(c10::toString(dtype)) + "[" +
                                     std::to_string(n) + "]";
            const at::Tensor base = torch::arange(n, torch::TensorOptions().dtype(dtype)).to(cuda);
            for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
              at::Tensor t = base.clone();
              pg.all_reduce(t, op);
              expect_equal(t, base, std::string("all_reduce ") + to_string(op) + " " + what);
            }
            if (dtype != torch::kLong) {
              at::Tensor t = base.clone();
              pg.all_reduce(t, ReduceOp::kAvg);
              expect_equal(t, base, "all_reduce avg " + what);
            }
            at::Tensor async = base.clone();
            pg.all_reduce_async(async).wait();
            expect_equal(async, base, "all_reduce_async " + what);
            at::Tensor b = base.clone();
            pg.broadcast(b, 0);
            expect_equal(b, base, "broadcast " + what);
            const auto gathered = pg.all_gather(base);
            ASSERT_EQ(gathered.size(), 1u);
            expect_equal(gathered[0], base, "all_gather " + what);
            at::Tensor into = torch::empty_like(base);
            pg.all_gather_into(into, base);
            expect_equal(into, base, "all_gather_into " + what);
            at::Tensor scattered = torch::empty_like(base);
            pg.reduce_scatter(scattered, base);
            expect_equal(scattered, base, "reduce_scatter " + what);
          }
        }
        pg.barrier();
        EXPECT_EQ(pg.all_gather_strings("nccl"), std::vector<std::string>{"nccl"});
      },
      nccl_options());
}

// The child half of the timeout check: a collective queued behind a
// 20-second kernel on a 2-second timeout. Prints tandem's TimeoutError the
// moment it is thrown and exits 0 then, 1 on any other outcome; _exit skips
// NCCL's teardown, which would wait for the kernel.
TEST(NcclWorld1, TimeoutChild) {
  if (std::getenv("TANDEM_GPU_TIMEOUT_CHILD") == nullptr) {
    GTEST_SKIP() << "the child of NcclWorld1.ATimeoutFiresAndNamesTheOperation";
  }
#if defined(TANDEM_WITH_NCCL)
  ProcessGroupOptions options = nccl_options();
  options.timeout = std::chrono::seconds(2);
  try {
    testing::run_ranks(
        1,
        [](ProcessGroup& pg) {
          at::Tensor t = torch::ones({1001}, torch::Device(torch::kCUDA, 0));
          pg.all_reduce(t);  // the communicator exists before the stall
          torch::cuda::synchronize();
          at::cuda::sleep(int64_t{40} * 1000 * 1000 * 1000);  // ~20 s at 2 GHz
          const auto start = std::chrono::steady_clock::now();
          try {
            pg.all_reduce(t);
          } catch (const TimeoutError& e) {
            const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
            std::printf("child: TimeoutError after %.1f s: %s\n", waited.count(), e.what());
            std::fflush(stdout);
            ::_exit(0);
          }
        },
        options);
    std::printf("child: the all_reduce returned without a timeout\n");
  } catch (const std::exception& e) {
    std::printf("child: other error: %s\n", e.what());
  }
  std::fflush(stdout);
  ::_exit(1);
#endif
}

TEST(NcclWorld1, ATimeoutFiresAndNamesTheOperation) {
  TANDEM_REQUIRE_NCCL();
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const auto result = testing::run_process(
      {self, "--gtest_filter=NcclWorld1.TimeoutChild"}, 120, {"TANDEM_GPU_TIMEOUT_CHILD=1"});
  const std::string output = result.out + result.err;
  // What must hold: tandem's error came, in time, and named the collective
  // (NCCL's watchdog, a minute later, would have ended the process anyway).
  EXPECT_FALSE(result.timed_out) << output;
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_NE(output.find("child: TimeoutError"), std::string::npos) << output;
  EXPECT_NE(output.find("all_reduce #"), std::string::npos) << output;
  EXPECT_NE(output.find("on nccl"), std::string::npos) << output;
  EXPECT_LT(result.seconds, 30) << "the 2 s timeout took " << result.seconds << " s\n" << output;
  testing::record_gpu_figures("nccl_timeout", {{"seconds_to_error", result.seconds},
                                               {"exit_code", result.exit_code},
                                               {"signal", result.signal}});
}

TEST(NcclWorld1, DdpThroughNcclEqualsPlainTrainingOnTheGpu) {
  TANDEM_REQUIRE_NCCL();
  const torch::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(7);
  testing::Mlp init(6, 16, 3);
  const auto x = torch::randn({5, 12, 6}).to(cuda), y = torch::randn({5, 12, 3}).to(cuda);
  testing::Mlp reference(6, 16, 3);
  testing::copy_state(*reference, *init);
  reference->to(cuda);
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < 5; ++s) {
    reference_sgd.zero_grad();
    torch::mse_loss(reference->forward(x[s]), y[s]).backward();
    reference_sgd.step();
  }
  testing::run_ranks(
      1,
      [&](ProcessGroup& pg) {
        testing::Mlp model(6, 16, 3);
        testing::copy_state(*model, *init);
        model->to(cuda);
        DistributedDataParallel ddp(model, pg.shared_from_this());
        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
        for (int s = 0; s < 5; ++s) {
          sgd.zero_grad();
          torch::mse_loss(model->forward(x[s]), y[s]).backward();
          sgd.step();
        }
        model->to(torch::kCPU);
        reference->to(torch::kCPU);
        EXPECT_LT(testing::max_relative_diff(*model, *reference), 1e-6);
      },
      nccl_options());
}

}  // namespace gpu_nccl_test
}  // namespace tandem
