// 4.5 zero::Init on CUDA: a model built under Init for the GPU keeps only
// this rank's shard of each unit, on the GPU, and trains bit-identically to
// the materialised model; through the Accelerator (zero3_init in the config,
// accelerator.zero_init()) as well. Two ranks (processes) share the GPU over
// Gloo.

#include <mutex>
#include <optional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/scratch_dir.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/parameters.h"
#include "tandem/core/rank_env.h"

namespace tandem {
namespace gpu_zero_init_test {

// Through the Accelerator on this rank: rank 0 writes the trained weights.
testing::Params train_through_accelerator(std::shared_ptr<ProcessGroup> pg, bool zero3_init) {
  testing::Recipe r;
  r.width = 19;
  Config config;
  config.zero.stage = 3;
  config.zero.zero3_init = zero3_init;
  config.zero.stage3_param_persistence_threshold = 0;
  auto gen = at::detail::createCPUGenerator(3);
  const auto x = torch::randn({32, r.in}, gen);
  const auto y = torch::randint(0, r.out, {32}, gen);
  AcceleratorOptions options;
  options.cpu = testing::gpu_worker_device().is_cpu();
  Accelerator accelerator(std::move(pg), config, options);
  EXPECT_EQ(accelerator.device().type(), testing::gpu_worker_device().type());
  std::optional<testing::Stack> built;
  {
    torch::manual_seed(42);
    auto init = accelerator.zero_init();
    EXPECT_EQ(init.enabled(), zero3_init);
    built.emplace(r.in, r.width, r.out, r.depth, r.loose);
  }
  testing::Stack model = *built;
  auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                     torch::optim::AdamWOptions(1e-2));
  accelerator.prepare_model(model);
  DistributedLoaderOptions loader_options;
  loader_options.batch_size = 4;
  loader_options.shuffle = false;
  auto loader = accelerator.prepare_data_loader({x, y}, loader_options);
  auto optimizer = accelerator.prepare_optimizer(adamw);
  for (auto& batch : *loader) {
    EXPECT_EQ(batch[0].device(), accelerator.device());
    optimizer->zero_grad();
    accelerator.backward(torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
    optimizer->step();
  }
  ZeroOptimizer::GatheredParameters whole(*accelerator.zero_optimizer());
  return testing::snapshot(*model);
}

// One rank of two: the materialised and the cut model, with the
// ZeroOptimizer directly and through the Accelerator.
TEST(GpuZeroInit, Worker) {
  const std::string dir = testing::gpu_worker_dir();
  if (dir.empty()) GTEST_SKIP() << "a worker of GpuZeroInit (launch_gpu_workers runs it)";
  auto pg = ProcessGroup::init(RankEnv::from_environment());
  testing::Recipe r;
  r.width = 19;
  r.device = testing::gpu_worker_device();
  testing::write_worker_result(dir, "whole", pg->rank(),
                               testing::train_zero(*pg, r, testing::stage3()));
  r.zero_init = true;
  {
    testing::Stack probe = testing::make_model(r, pg.get());
    for (const auto& block : probe->blocks) {
      for (const auto& p : block->parameters()) {
        EXPECT_EQ(p.device(), r.device) << "a cut parameter is not on the training device";
        EXPECT_FALSE(holds_memory(p)) << "a cut parameter holds the whole tensor";
      }
    }
  }
  testing::write_worker_result(dir, "cut", pg->rank(),
                               testing::train_zero(*pg, r, testing::stage3()));
  testing::write_worker_result(dir, "accelerator_whole", pg->rank(),
                               train_through_accelerator(pg, false));
  testing::write_worker_result(dir, "accelerator_cut", pg->rank(),
                               train_through_accelerator(pg, true));
}

void expect_identical(const testing::Params& got, const testing::Params& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, value] : want) {
    EXPECT_TRUE(torch::equal(got.at(name), value)) << what << ": " << name;
  }
}

TEST(GpuZeroInit, UnitsCutOnTheGpuTrainExactlyAsTheMaterialisedModel) {
  TANDEM_REQUIRE_CUDA();
  testing::ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(testing::launch_gpu_workers("GpuZeroInit.Worker", 2, dir.path()));
  for (int rank = 0; rank < 2; ++rank) {
    const std::string what = "rank " + std::to_string(rank);
    expect_identical(testing::read_worker_result(dir.path(), "cut", rank),
                     testing::read_worker_result(dir.path(), "whole", rank), what);
    expect_identical(testing::read_worker_result(dir.path(), "accelerator_cut", rank),
                     testing::read_worker_result(dir.path(), "accelerator_whole", rank),
                     "accelerator.zero_init(), " + what);
  }
}

}  // namespace gpu_zero_init_test
}  // namespace tandem
