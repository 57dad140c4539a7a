// The Accelerator with zero_optimization.stage 1-3 trains like it does with
// DDP (stage 0): gradient accumulation, clipping, the config's optimizer
// block, loss scaling with overflow agreement, and bf16 parameters.

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

using testing::Params;
using testing::run_ranks;

struct Variant {
  bool optimizer_from_config = false;
  std::string config_optimizer = "AdamW";  // the config's optimizer.type
  // Adam with amsgrad in code, which ZeRO steps through
  // AcceleratorOptions::zero_shard_optimizer_factory.
  bool amsgrad_by_factory = false;
  bool loss_scaling = false;
  bool bf16_params = false;
  int inf_loss_on_rank1_at_step = -1;  // an overflow on one rank only
  bool zero3_init = false;  // config zero3_init: build under accelerator.zero_init()
  bool offload_param = false;  // config offload_param.device cpu
};

struct Result {
  Params params;  // rank 0's
  std::vector<int64_t> skipped;  // per rank
};

Result train(int world, int stage, Variant v = {}) {
  testing::Recipe r;
  Config config;
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 200;
  config.zero.zero3_init = v.zero3_init;
  if (v.offload_param) config.zero.offload_param = OffloadDevice::kCpu;
  if (v.optimizer_from_config) {
    config.optimizer.type = v.config_optimizer;
    // RMSprop divides by the root of the gradient's running square, so an
    // element whose gradient is rounding noise around 0 moves by up to
    // ~10 lr on noise alone: at 1e-2 the runs part by 2e-5 (the same
    // arithmetic reduced in another order); at 1e-3 by under 1e-5.
    config.optimizer.lr = v.config_optimizer == "RMSprop" ? 1e-3 : 1e-2;
  }
  AcceleratorOptions accelerator_options;
  if (v.amsgrad_by_factory) {
    accelerator_options.zero_shard_optimizer_factory =
        [](std::vector<torch::optim::OptimizerParamGroup> groups) {
          return std::make_unique<torch::optim::Adam>(std::move(groups));
        };
  }
  if (v.loss_scaling) accelerator_options.loss_scaling = LossScaleConfig{};
  auto gen = at::detail::createCPUGenerator(3);
  const auto x = torch::randn({48, r.in}, gen);
  const auto y = torch::randint(0, r.out, {48}, gen);
  Result out;
  out.skipped.assign(world, -1);
  std::mutex mutex;
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, accelerator_options);
    std::optional<testing::Stack> built;
    {
      std::lock_guard<std::mutex> lock(testing::init_mutex());
      torch::manual_seed(42);
      auto init = accelerator.zero_init();
      EXPECT_EQ(init.enabled(), v.zero3_init && stage == 3);
      built.emplace(r.in, r.width, r.out, r.depth, r.loose);
      EXPECT_EQ(init.units_cut(), init.enabled() ? r.depth : 0);
    }
    testing::Stack model = *built;
    if (v.bf16_params) model->to(torch::kBFloat16);
    std::shared_ptr<torch::optim::Optimizer> adamw;
    if (v.amsgrad_by_factory) {
      adamw = std::make_shared<torch::optim::Adam>(
          model->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
    } else {
      adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                    torch::optim::AdamWOptions(1e-2));
    }
    DistributedLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = false;
    accelerator.prepare_model(model);
    auto loader = accelerator.prepare_data_loader({x, y}, options);
    auto optimizer = v.optimizer_from_config ? accelerator.prepare_optimizer_from_config()
                                             : accelerator.prepare_optimizer(adamw);
    EXPECT_EQ(accelerator.zero_optimizer() != nullptr, stage > 0);
    int micro = 0;
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      auto logits = model->forward(batch[0].to(v.bf16_params ? torch::kBFloat16 : torch::kFloat));
      auto loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch[1]);
      if (pg.rank() == 1 && micro / 2 == v.inf_loss_on_rank1_at_step) {
        loss = loss * std::numeric_limits<double>::infinity();
      }
      accelerator.backward(loss);
      optimizer->step();
      ++micro;
    }
    std::optional<ZeroOptimizer::GatheredParameters> whole;
    if (stage == 3) whole.emplace(*accelerator.zero_optimizer());
    std::lock_guard<std::mutex> lock(mutex);
    out.skipped[pg.rank()] = accelerator.skipped_steps();
    if (pg.rank() == 0) {
      // 48 rows, 4 per micro-batch per rank, 2 micro-steps per step.
      EXPECT_EQ(accelerator.step(), 48 / (4 * world) / 2 - accelerator.skipped_steps());
      for (auto& [name, p] : testing::snapshot(*model)) out.params[name] = p.to(torch::kFloat);
    }
  });
  return out;
}

TEST(AcceleratorZero, EveryStageTrainsLikeDdpWithAccumulationAndClipping) {
  const Params ddp = train(2, 0).params;
  for (int stage = 1; stage <= 3; ++stage) {
    EXPECT_LT(testing::max_relative_diff(train(2, stage).params, ddp), 1e-5) << "stage " << stage;
  }
}

// offload_param below stage 3 warns that it does nothing (as DeepSpeed
// ignores it there), and then does nothing: the run trains.
TEST(AcceleratorZero, ParamOffloadBelowStage3TrainsAsWithout) {
  const Params ddp = train(2, 0).params;
  Variant offload;
  offload.offload_param = true;
  for (int stage = 1; stage <= 3; ++stage) {
    EXPECT_LT(testing::max_relative_diff(train(2, stage, offload).params, ddp), 1e-5)
        << "stage " << stage;
  }
}

TEST(AcceleratorZero, Zero3InitFromTheConfigCutsTheModelAndTrainsTheSame) {
  Variant cut;
  cut.zero3_init = true;
  for (int world : {2, 3}) {
    EXPECT_EQ(testing::max_relative_diff(train(world, 3, cut).params, train(world, 3).params), 0.0)
        << world << " ranks";
  }
  // Below stage 3 the flag builds the model whole (zero_init() does nothing).
  EXPECT_EQ(testing::max_relative_diff(train(2, 2, cut).params, train(2, 2).params), 0.0);
}

TEST(AcceleratorZero, TheConfigsOptimizerBlockBuildsTheSameOptimizer) {
  // AdamWOptions(1e-2) in code and {"type": "AdamW", "params": {"lr": 0.01}}.
  Variant from_config;
  from_config.optimizer_from_config = true;
  EXPECT_LT(testing::max_relative_diff(train(2, 2, from_config).params, train(2, 2).params), 1e-7);
}

TEST(AcceleratorZero, EachConfigOptimizerTypeTrainsUnderZeroLikeUnderDdp) {
  for (const char* type : {"Adagrad", "RMSprop", "Lion", "Lamb"}) {
    Variant v;
    v.optimizer_from_config = true;
    v.config_optimizer = type;
    const Params ddp = train(2, 0, v).params;
    for (int stage : {2, 3}) {
      EXPECT_LT(testing::max_relative_diff(train(2, stage, v).params, ddp), 1e-5)
          << type << " stage " << stage;
    }
  }
}

TEST(AcceleratorZero, TheShardOptimizerFactoryRunsAnOptimizerZeroDoesNotKnow) {
  Variant v;
  v.amsgrad_by_factory = true;
  const Params ddp = train(3, 0, v).params;
  EXPECT_LT(testing::max_relative_diff(train(3, 2, v).params, ddp), 1e-5);
  EXPECT_LT(testing::max_relative_diff(train(3, 3, v).params, ddp), 1e-5);
  // Without the factory ZeRO refuses amsgrad rather than dropping it.
  Config config;
  config.zero.stage = 2;
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack model = testing::make_model(testing::Recipe{});
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions().amsgrad(true));
    accelerator.prepare_model(model);
    EXPECT_THROW(accelerator.prepare_optimizer(adam), UsageError);
  });
}

TEST(AcceleratorZero, LossScalingUnscalesTheShardsAndEveryRankSkipsAnOverflow) {
  Variant scaled;
  scaled.loss_scaling = true;
  const Params ddp = train(2, 0, scaled).params;
  Variant overflow = scaled;
  overflow.inf_loss_on_rank1_at_step = 1;
  for (int stage = 2; stage <= 3; ++stage) {
    EXPECT_LT(testing::max_relative_diff(train(2, stage, scaled).params, ddp), 1e-5)
        << "stage " << stage;
    const Result skipped = train(2, stage, overflow);
    EXPECT_EQ(skipped.skipped, (std::vector<int64_t>{1, 1})) << "stage " << stage;
    for (const auto& [name, p] : skipped.params) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
}

TEST(AcceleratorZero, Bf16ParametersTrainThroughFp32MasterShardsLikeDdp) {
  Variant bf16;
  bf16.bf16_params = true;
  const Params ddp = train(2, 0, bf16).params;  // DDP + MasterWeights
  const Params initial = [] {
    Params p;
    for (auto& [name, t] : testing::snapshot(*testing::make_model(testing::Recipe{}))) {
      p[name] = t.to(torch::kBFloat16).to(torch::kFloat);
    }
    return p;
  }();
  auto distance = [](const Params& a, const Params& b) {
    double sum = 0;
    for (const auto& [name, t] : b) sum += (a.at(name) - t).pow(2).sum().item<double>();
    return std::sqrt(sum);
  };
  const double moved = distance(ddp, initial);
  ASSERT_GT(moved, 0.1);
  for (int stage = 2; stage <= 3; ++stage) {
    // Both round to bf16 after an fp32 update; DDP averages bf16 gradients
    // where ZeRO reduces in fp32, so the two part by bf16 rounding only:
    // far less than training moved the parameters.
    const double apart = distance(train(2, stage, bf16).params, ddp);
    EXPECT_LT(apart, 0.05 * moved) << "stage " << stage << ": " << apart << " vs " << moved;
  }
}

}  // namespace
}  // namespace tandem
