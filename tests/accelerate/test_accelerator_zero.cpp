// The Accelerator with zero_optimization.stage 1-3 trains like it does with
// DDP (stage 0): gradient accumulation, clipping and the config's settings.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "zero/zero_test_models.h"

namespace tandem {
namespace {

using testing::Params;
using testing::run_ranks;

Params train(int world, int stage, bool optimizer_from_config = false) {
  testing::Recipe r;
  Config config;
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  config.zero.stage = stage;
  config.zero.reduce_bucket_size = 200;
  if (optimizer_from_config) {
    config.optimizer.type = "AdamW";
    config.optimizer.lr = 1e-2;
  }
  auto gen = at::detail::createCPUGenerator(3);
  const auto x = torch::randn({48, r.in}, gen);
  const auto y = torch::randint(0, r.out, {48}, gen);
  Params out;
  std::mutex mutex;
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack model = testing::make_model(r);
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
    DistributedLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = false;
    accelerator.prepare_model(model);
    auto loader = accelerator.prepare_data({x, y}, options);
    auto optimizer = optimizer_from_config ? accelerator.prepare_optimizer_from_config()
                                           : accelerator.prepare_optimizer(adamw);
    EXPECT_EQ(accelerator.zero_optimizer() != nullptr, stage > 0);
    for (auto& batch : loader) {
      optimizer.zero_grad();
      accelerator.backward(
          torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
      optimizer.step();
    }
    EXPECT_EQ(accelerator.step(), 3);
    std::optional<ZeroOptimizer::GatheredParameters> whole;
    if (stage == 3) whole.emplace(*accelerator.zero_optimizer());
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() == 0) out = testing::snapshot(*model);
  });
  return out;
}

TEST(AcceleratorZero, EveryStageTrainsLikeDdpWithAccumulationAndClipping) {
  const Params ddp = train(2, 0);
  for (int stage = 1; stage <= 3; ++stage) {
    EXPECT_LT(testing::max_relative_diff(train(2, stage), ddp), 1e-5) << "stage " << stage;
  }
}

TEST(AcceleratorZero, TheConfigsOptimizerBlockBuildsTheSameOptimizer) {
  // AdamWOptions(1e-2) in code and {"type": "AdamW", "params": {"lr": 0.01}}.
  EXPECT_LT(testing::max_relative_diff(train(2, 2, true), train(2, 2, false)), 1e-7);
}

}  // namespace
}  // namespace tandem
