// 4.2 Two ranks sharing one GPU, over Gloo with CUDA tensors (NCCL refuses two
// ranks on one device): DDP and ZeRO stages 1, 2 and 3 match single-process
// training on the same GPU, with the CPU suites' tolerance (1e-5 relative,
// tests/zero/test_zero_parity.cpp). The recipe has gradient accumulation,
// clipping, an odd width and a loose input/output layer around the units.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/thread_ranks.h"
#include "zero/zero_test_models.h"

namespace tandem {
namespace gpu_parity_test {

using testing::gloo_on_cuda;

testing::Recipe gpu_recipe(testing::Opt opt) {
  testing::Recipe r;
  r.width = 19;  // odd: shards split inside tensors
  r.opt = opt;
  r.device = torch::Device(torch::kCUDA, 0);
  return r;
}

// The single-process run on the GPU: DDP at world 1 (a real group).
testing::Params world1(const testing::Recipe& r) {
  testing::Params out;
  testing::run_ranks(1, [&](ProcessGroup& pg) { out = testing::train_ddp(pg, r); },
                     gloo_on_cuda());
  return out;
}

TEST(GpuParity, DdpOnTwoRanksSharingOneGpuMatchesOneRank) {
  TANDEM_REQUIRE_CUDA();
  const auto r = gpu_recipe(testing::Opt::kAdamW);
  const testing::Params expected = world1(r);
  testing::run_ranks(
      2,
      [&](ProcessGroup& pg) {
        EXPECT_LT(testing::max_relative_diff(testing::train_ddp(pg, r), expected), 1e-5)
            << "rank " << pg.rank();
      },
      gloo_on_cuda());
}

TEST(GpuParity, ZeroStagesOneTwoThreeOnTwoRanksSharingOneGpuMatchOneRank) {
  TANDEM_REQUIRE_CUDA();
  for (auto opt : {testing::Opt::kAdamW, testing::Opt::kSgd}) {
    const auto r = gpu_recipe(opt);
    const testing::Params expected = world1(r);
    for (int stage : {1, 2, 3}) {
      ZeroOptions options = stage == 3 ? testing::stage3() : ZeroOptions{};
      options.stage = stage;
      options.reduce_bucket_size = 150;  // several buckets
      testing::run_ranks(
          2,
          [&](ProcessGroup& pg) {
            EXPECT_LT(testing::max_relative_diff(testing::train_zero(pg, r, options), expected),
                      1e-5)
                << "stage " << stage << " rank " << pg.rank();
          },
          gloo_on_cuda());
    }
  }
}

}  // namespace gpu_parity_test
}  // namespace tandem
