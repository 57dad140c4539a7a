// 4.2 Two ranks sharing one GPU, over Gloo with CUDA tensors (NCCL refuses two
// ranks on one device): DDP and ZeRO stages 1, 2 and 3 match single-process
// training on the same GPU, with the CPU suites' tolerance (1e-5 relative,
// tests/zero/test_zero_parity.cpp). The recipe has gradient accumulation,
// clipping, an odd width and a loose input/output layer around the units.
// The two ranks are processes under `tandem launch` (gpu_testing.h says why
// not threads); the single-process reference runs in this test's process.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/rank_env.h"

namespace tandem {
namespace gpu_parity_test {

using testing::gloo_on_cuda;

const std::vector<std::pair<std::string, testing::Opt>> kOptimizers = {
    {"adamw", testing::Opt::kAdamW}, {"sgd", testing::Opt::kSgd}};

testing::Recipe gpu_recipe(testing::Opt opt, c10::Device device) {
  testing::Recipe r;
  r.width = 19;  // odd: shards split inside tensors
  r.opt = opt;
  r.device = device;
  return r;
}

ZeroOptions zero_stage(int stage) {
  ZeroOptions options = stage == 3 ? testing::stage3() : ZeroOptions{};
  options.stage = stage;
  options.reduce_bucket_size = 150;  // several buckets
  return options;
}

// One rank of the two: DDP and each ZeRO stage, for each optimizer.
TEST(GpuParity, Worker) {
  const std::string dir = testing::gpu_worker_dir();
  if (dir.empty()) GTEST_SKIP() << "a worker of GpuParity (launch_gpu_workers runs it)";
  auto pg = ProcessGroup::init(RankEnv::from_environment());
  for (const auto& [name, opt] : kOptimizers) {
    const auto r = gpu_recipe(opt, testing::gpu_worker_device());
    testing::write_worker_result(dir, "ddp_" + name, pg->rank(), testing::train_ddp(*pg, r));
    for (int stage : {1, 2, 3}) {
      testing::write_worker_result(dir, "zero" + std::to_string(stage) + "_" + name, pg->rank(),
                                   testing::train_zero(*pg, r, zero_stage(stage)));
    }
  }
}

TEST(GpuParity, DdpAndZeroStagesOnTwoProcessesSharingOneGpuMatchOneRank) {
  TANDEM_REQUIRE_CUDA();
  testing::ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(testing::launch_gpu_workers("GpuParity.Worker", 2, dir.path()));
  for (const auto& [name, opt] : kOptimizers) {
    testing::Params expected;
    testing::run_ranks(
        1,
        [&](ProcessGroup& pg) {
          expected = testing::train_ddp(pg, gpu_recipe(opt, torch::Device(torch::kCUDA, 0)));
        },
        gloo_on_cuda());
    for (const std::string run : {"ddp", "zero1", "zero2", "zero3"}) {
      for (int rank = 0; rank < 2; ++rank) {
        const auto got = testing::read_worker_result(dir.path(), run + "_" + name, rank);
        EXPECT_LT(testing::max_relative_diff(got, expected), 1e-5)
            << run << " " << name << " rank " << rank;
      }
    }
  }
}

}  // namespace gpu_parity_test
}  // namespace tandem
