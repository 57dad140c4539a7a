// 4.5 zero::Init on CUDA: a model built under Init for the GPU keeps only
// this rank's shard of each unit, on the GPU, and trains bit-identically to
// the materialised model; through the Accelerator (zero3_init in the config,
// accelerator.zero_init()) as well. Two ranks share the GPU over Gloo.

#include <mutex>
#include <optional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/parameters.h"
#include "zero/zero_test_models.h"

namespace tandem {
namespace gpu_zero_init_test {

using testing::gloo_on_cuda;

void expect_identical(const testing::Params& got, const testing::Params& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, value] : want) {
    EXPECT_TRUE(torch::equal(got.at(name), value)) << what << ": " << name;
  }
}

TEST(GpuZeroInit, UnitsCutOnTheGpuTrainExactlyAsTheMaterialisedModel) {
  TANDEM_REQUIRE_CUDA();
  testing::Recipe r;
  r.width = 19;
  r.device = torch::Device(torch::kCUDA, 0);
  std::vector<testing::Params> whole(2), cut(2);
  testing::run_ranks(
      2, [&](ProcessGroup& pg) { whole[pg.rank()] = testing::train_zero(pg, r, testing::stage3()); },
      gloo_on_cuda());
  r.zero_init = true;
  testing::run_ranks(
      2,
      [&](ProcessGroup& pg) {
        {
          testing::Stack probe = testing::make_model(r, &pg);
          for (const auto& block : probe->blocks) {
            for (const auto& p : block->parameters()) {
              EXPECT_TRUE(p.is_cuda()) << "a cut parameter stayed on " << p.device();
              EXPECT_FALSE(holds_memory(p)) << "a cut parameter holds the whole tensor";
            }
          }
        }
        cut[pg.rank()] = testing::train_zero(pg, r, testing::stage3());
      },
      gloo_on_cuda());
  for (int rank = 0; rank < 2; ++rank) {
    expect_identical(cut[rank], whole[rank], "rank " + std::to_string(rank));
  }
}

testing::Params train_through_accelerator(bool zero3_init) {
  testing::Recipe r;
  r.width = 19;
  Config config;
  config.zero.stage = 3;
  config.zero.zero3_init = zero3_init;
  config.zero.stage3_param_persistence_threshold = 0;
  auto gen = at::detail::createCPUGenerator(3);
  const auto x = torch::randn({32, r.in}, gen);
  const auto y = torch::randint(0, r.out, {32}, gen);
  testing::Params out;
  testing::run_ranks(
      2,
      [&](ProcessGroup& pg) {
        Accelerator accelerator(pg.shared_from_this(), config);
        EXPECT_TRUE(accelerator.device().is_cuda());
        std::optional<testing::Stack> built;
        {
          std::lock_guard<std::mutex> lock(testing::init_mutex());
          torch::manual_seed(42);
          auto init = accelerator.zero_init();
          EXPECT_EQ(init.enabled(), zero3_init);
          built.emplace(r.in, r.width, r.out, r.depth, r.loose);
        }
        testing::Stack model = *built;
        auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                           torch::optim::AdamWOptions(1e-2));
        accelerator.prepare_model(model);
        DistributedLoaderOptions options;
        options.batch_size = 4;
        options.shuffle = false;
        auto loader = accelerator.prepare_data_loader({x, y}, options);
        auto optimizer = accelerator.prepare_optimizer(adamw);
        for (auto& batch : *loader) {
          ASSERT_TRUE(batch[0].is_cuda());
          optimizer->zero_grad();
          accelerator.backward(
              torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
          optimizer->step();
        }
        ZeroOptimizer::GatheredParameters whole(*accelerator.zero_optimizer());
        if (pg.rank() == 0) out = testing::snapshot(*model);
      },
      gloo_on_cuda());
  return out;
}

TEST(GpuZeroInit, TheAcceleratorsZeroInitCutsOnTheGpuAndTrainsTheSame) {
  TANDEM_REQUIRE_CUDA();
  expect_identical(train_through_accelerator(true), train_through_accelerator(false),
                   "accelerator.zero_init() on CUDA");
}

}  // namespace gpu_zero_init_test
}  // namespace tandem
