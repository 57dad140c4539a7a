// Accelerator: a prepared loop must train exactly like single-process
// training on the concatenated batch, with gradient accumulation, and its
// optimizer and scheduler must step once per real optimizer step.

#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::copy_state;
using testing::max_relative_diff;
using testing::Mlp;
using testing::run_ranks;

using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::reference_init;

using testing::config_with_accumulation;
using testing::Dataset;
using testing::make_dataset;

// Single process: each optimizer step sees the samples that all ranks' k
// micro-batches hold together. With shuffle off, rank r's entry j is sample
// j * world + r, so a step's samples are one contiguous global range.
Mlp train_reference(const Dataset& data, int world, int64_t batch, int64_t accumulation,
                    int64_t steps) {
  Mlp model(kIn, kHidden, kOut);
  copy_state(*model, *reference_init());
  auto opt = std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const int64_t per_step = world * batch * accumulation;
  for (int64_t s = 0; s < steps; ++s) {
    auto x = data.x.narrow(0, s * per_step, per_step);
    auto y = data.y.narrow(0, s * per_step, per_step);
    opt->zero_grad();
    torch::mse_loss(model(x), y).backward();
    opt->step();
  }
  return model;
}

class AcceleratorParity : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(AcceleratorParity, AccumulatedDistributedStepsEqualOneBigBatch) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  const auto [world, accumulation] = GetParam();
  constexpr int64_t kBatch = 4, kSteps = 3;
  const auto data = make_dataset(world * kBatch * accumulation * kSteps);
  const Mlp reference = train_reference(data, world, kBatch, accumulation, kSteps);
  run_ranks(world, [&, world = world, accumulation = accumulation](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(accumulation));
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DistributedLoaderOptions options;
    options.batch_size = kBatch;
    options.shuffle = false;
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, options);
    ASSERT_EQ(accelerator.gradient_accumulation_steps(), accumulation);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
    }
    EXPECT_EQ(accelerator.step(), kSteps);
    EXPECT_LT(max_relative_diff(*model, *reference), 1e-5) << "rank " << pg.rank() << "/" << world;
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndAccumulation, AcceleratorParity,
                         ::testing::Values(std::make_tuple(1, int64_t{1}),
                                           std::make_tuple(2, int64_t{1}),
                                           std::make_tuple(2, int64_t{2}),
                                           std::make_tuple(4, int64_t{3})));

TEST(Accelerator, AccumulateGuardGivesTheSameTrainingAsBackwardAlone) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  constexpr int kWorld = 2;
  constexpr int64_t kBatch = 3, kAccumulation = 2, kSteps = 2;
  const auto data = make_dataset(kWorld * kBatch * kAccumulation * kSteps);
  const Mlp reference = train_reference(data, kWorld, kBatch, kAccumulation, kSteps);
  run_ranks(kWorld, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(kAccumulation));
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DistributedLoaderOptions options;
    options.batch_size = kBatch;
    options.shuffle = false;
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, options);
    std::vector<bool> syncs;
    for (auto& batch : *loader) {
      auto guard = accelerator.accumulate(model);
      syncs.push_back(accelerator.sync_gradients());
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
      optimizer->zero_grad();
    }
    EXPECT_EQ(syncs, (std::vector<bool>{false, true, false, true}));
    EXPECT_LT(max_relative_diff(*model, *reference), 1e-5);
  });
}

TEST(Accelerator, ZeroGradAtTheTopOfAGuardedStepKeepsTheAccumulatedGradients) {
  constexpr int kWorld = 2;
  constexpr int64_t kBatch = 3, kAccumulation = 2, kSteps = 2;
  const auto data = make_dataset(kWorld * kBatch * kAccumulation * kSteps);
  const Mlp reference = train_reference(data, kWorld, kBatch, kAccumulation, kSteps);
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  run_ranks(kWorld, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(kAccumulation));
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    DistributedLoaderOptions options;
    options.batch_size = kBatch;
    options.shuffle = false;
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, options);
    for (auto& batch : *loader) {
      auto guard = accelerator.accumulate(model);
      auto nested = accelerator.accumulate(model);  // same micro-step
      optimizer->zero_grad();  // on a boundary step too: must not erase the sum
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
    }
    EXPECT_EQ(accelerator.step(), kSteps);
    EXPECT_LT(max_relative_diff(*model, *reference), 1e-5);
  });
}

TEST(Accelerator, LastBatchOfAPassAlwaysSynchronises) {
  // 5 batches per rank with 2 accumulation steps: steps after batches 2, 4
  // and 5, so no partial sum leaks into the next epoch.
  const auto data = make_dataset(2 * 5);  // it seeds torch's generator: not in a rank thread
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(2));
    auto model = torch::nn::Linear(kIn, kOut);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, 1);
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader->set_epoch(epoch);
      std::vector<bool> syncs;
      for (auto& batch : *loader) {
        optimizer->zero_grad();
        accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
        syncs.push_back(accelerator.sync_gradients());
        optimizer->step();
      }
      EXPECT_EQ(syncs, (std::vector<bool>{false, true, false, true, true})) << "epoch " << epoch;
    }
    EXPECT_EQ(accelerator.step(), 6);
  });
}

// As Accelerate's AcceleratedScheduler: num_processes steps per optimizer
// step, none per accumulating micro-batch.
TEST(Accelerator, SchedulerStepsPerProcessOnOptimizerStepsNotPerMicroBatch) {
  const auto data = make_dataset(2 * 8);  // it seeds torch's generator: not in a rank thread
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(2));
    auto model = torch::nn::Linear(kIn, kOut);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(1.0));
    auto step_lr = std::make_shared<torch::optim::StepLR>(*sgd, /*step_size=*/1, /*gamma=*/0.5);
    auto [optimizer, loader, scheduler] =
        accelerator.prepare(model, sgd, {data.x, data.y}, 1, step_lr);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
      scheduler->step();  // called every micro-batch, as loops usually do
    }
    EXPECT_EQ(accelerator.step(), 4);
    EXPECT_EQ(scheduler->steps(), 8);
    // The same scheduler stepped exactly 4 x 2 times by hand.
    auto probe = torch::nn::Linear(kIn, kOut);
    auto probe_sgd = std::make_shared<torch::optim::SGD>(
        probe->parameters(), torch::optim::SGDOptions(1.0));
    auto probe_lr = std::make_shared<torch::optim::StepLR>(*probe_sgd, 1, 0.5);
    for (int i = 0; i < 8; ++i) probe_lr->step();
    EXPECT_DOUBLE_EQ(sgd->param_groups()[0].options().get_lr(),
                     probe_sgd->param_groups()[0].options().get_lr());
    EXPECT_LT(sgd->param_groups()[0].options().get_lr(), 0.5);
  });
}

TEST(Accelerator, StepWithoutAcceleratorBackwardUnderAccumulationIsAnError) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(2));
    auto model = torch::nn::Linear(kIn, kOut);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    torch::mse_loss(model(torch::randn({2, kIn})), torch::randn({2, kOut})).backward();
    try {
      optimizer->step();
      FAIL() << "expected UsageError";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("accelerator.backward(loss)"), std::string::npos)
          << e.what();
    }
  });
}

TEST(Accelerator, ClipGradNormUsesTheGlobalNormAndSkipsPartialSums) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  constexpr int kWorld = 2;
  const auto data = make_dataset(8);
  // Reference: the gradient of the mean loss over all 8 samples.
  Mlp single(kIn, kHidden, kOut);
  copy_state(*single, *reference_init());
  torch::mse_loss(single(data.x), data.y).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : single->parameters()) grads.push_back(p.grad().flatten());
  const double expected = torch::cat(grads).norm().item<double>();

  run_ranks(kWorld, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(1));
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    DistributedLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = false;
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, options);
    auto batch = *loader->next();
    accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
    const double norm = accelerator.clip_grad_norm(expected / 4);
    EXPECT_NEAR(norm, expected, 1e-5 * expected);
    std::vector<torch::Tensor> clipped;
    for (auto& p : model->parameters()) clipped.push_back(p.grad().flatten());
    EXPECT_NEAR(torch::cat(clipped).norm().item<double>(), expected / 4, 1e-4 * expected);
  });
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(2));
    auto model = torch::nn::Linear(kIn, kOut);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    accelerator.backward(torch::mse_loss(model(data.x), data.y));
    ASSERT_FALSE(accelerator.sync_gradients());
    EXPECT_TRUE(std::isnan(accelerator.clip_grad_norm(1e-3)));
  });
}

// torch::nn::utils::clip_grad_norm_ multiplies by the coefficient clamped
// at 1: a NaN norm makes every gradient NaN. Skipping the multiplication
// would step the finite gradients unclipped, silently.
TEST(Accelerator, ANanNormMakesEveryGradientNanAsTorchsClipDoes) {
  const Mlp init = reference_init();
  const auto data = make_dataset(8);
  for (int stage : {0, 2}) {
    run_ranks(2, [&](ProcessGroup& pg) {
      Config config = config_with_accumulation(1);
      config.zero.stage = stage;
      Accelerator accelerator(pg.shared_from_this(), config);
      Mlp model(kIn, kHidden, kOut);
      copy_state(*model, *init);
      auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                     torch::optim::SGDOptions(0.1));
      accelerator.prepare_model(model);
      auto optimizer = accelerator.prepare_optimizer(sgd);
      const auto params = model->parameters();
      const torch::Tensor poison = params.back().sum() * std::nan("");
      accelerator.backward(torch::mse_loss(model(data.x), data.y) + poison);
      EXPECT_TRUE(std::isnan(accelerator.clip_grad_norm(0.4))) << "stage " << stage;
      optimizer->step();
      for (const auto& p : params) {
        EXPECT_TRUE(p.isnan().all().item<bool>()) << "stage " << stage << ": " << p.sizes();
      }
    });
  }
}

TEST(Accelerator, ConfigGradientClippingIsAppliedByTheOptimizerStep) {
  run_ranks(1, [&](ProcessGroup& pg) {
    torch::manual_seed(3);
    Config config;
    config.gradient_clipping = 1e-3;
    Accelerator accelerator(pg.shared_from_this(), config);
    auto model = torch::nn::Linear(kIn, kOut);
    auto before = model->weight.detach().clone();
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(1.0));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    accelerator.backward(torch::mse_loss(model(torch::randn({8, kIn}) * 100), torch::zeros({8, kOut})));
    optimizer->step();
    // With lr 1 the whole update is the clipped gradient: norm <= 1e-3 (up
    // to float32 rounding of weight - before).
    const double moved = (model->weight - before).norm().item<double>();
    EXPECT_LE(moved, 1e-3 * (1 + 1e-4));
    EXPECT_GT(moved, 0.0);
  });
}

TEST(Accelerator, CodeOverridesBeatEnvironmentWhichBeatsTheFile) {
  run_ranks(1, [&](ProcessGroup& pg) {
    LauncherEnv env;
    env.config.gradient_accumulation_steps = 3;
    {
      Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(4), {}, env);
      EXPECT_EQ(accelerator.gradient_accumulation_steps(), 3);
    }
    AcceleratorOptions options;
    options.gradient_accumulation_steps = 2;
    Accelerator accelerator(pg.shared_from_this(), config_with_accumulation(4), options, env);
    EXPECT_EQ(accelerator.gradient_accumulation_steps(), 2);
  });
}

TEST(Accelerator, PerProcessBatchCompletesTheDeepSpeedBatchTriple) {
  const auto data = make_dataset(64);  // it seeds torch's generator: not in a rank thread
  run_ranks(2, [&](ProcessGroup& pg) {
    Config config;
    config.train_batch_size = 32;
    Accelerator accelerator(pg.shared_from_this(), config);
    accelerator.prepare_data_loader(std::vector<torch::Tensor>{data.x, data.y}, 4);
    EXPECT_EQ(accelerator.gradient_accumulation_steps(), 4);  // 32 = 4 * 4 * 2
    EXPECT_EQ(accelerator.config().train_micro_batch_size_per_gpu, 4);
  });
}

// Issue 33's bug: a config's micro batch that disagrees with the program's
// loader used to be overridden by the loader without a word.
TEST(Accelerator, AConfigMicroBatchThatDisagreesWithTheLoaderIsAnErrorNamingBoth) {
  const auto data = make_dataset(96);  // it seeds torch's generator: not in a rank thread
  for (int world : {2, 3}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      Config config = parse_config_text(
          "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 0}}",
          "ds.json");
      {
        Accelerator accelerator(pg.shared_from_this(), config);
        try {
          accelerator.prepare_data_loader(std::vector<torch::Tensor>{data.x, data.y}, 8);
          ADD_FAILURE() << "a loader batch of 8 against the file's 4 was accepted";
        } catch (const UsageError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("train_micro_batch_size_per_gpu 4 (from ds.json:1:36) disagrees "
                              "with the data loader's batch size 8"),
                    std::string::npos)
              << what;
        }
      }
      // Agreeing, or given in one place only: that value is used.
      Accelerator agreeing(pg.shared_from_this(), config);
      agreeing.prepare_data_loader(std::vector<torch::Tensor>{data.x, data.y}, 4);
      EXPECT_EQ(agreeing.config().train_micro_batch_size_per_gpu, 4);
      Accelerator loader_only(pg.shared_from_this(), Config{});
      loader_only.prepare_data_loader(std::vector<torch::Tensor>{data.x, data.y}, 8);
      EXPECT_EQ(loader_only.config().train_micro_batch_size_per_gpu, 8);
      EXPECT_EQ(loader_only.config().train_batch_size, 8 * world);
    });
  }
}

TEST(Accelerator, ZeroStageThreeWithoutUnitsKeepsTheParametersWholeAsFsdpsRootUnit) {
  // Refused before issue 44; now FSDP's root unit: nothing partitioned, the
  // gradients and optimizer state sharded (AcceleratorAutoWrap.* trains it).
  run_ranks(2, [&](ProcessGroup& pg) {
    Config zero;
    zero.zero.stage = 3;
    Accelerator accelerator(pg.shared_from_this(), zero);
    Mlp model(kIn, kHidden, kOut);
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters());
    accelerator.prepare_model(model);
    accelerator.prepare_optimizer(adam);
    ASSERT_NE(accelerator.zero_optimizer(), nullptr);
    int64_t whole = 0;
    for (const auto& p : model->parameters()) whole += p.numel() * 4;
    // Whole on each rank (the flat buffer pads to a multiple of the ranks).
    const int64_t held = accelerator.zero_optimizer()->memory_stats().parameter_bytes;
    EXPECT_GE(held, whole);
    EXPECT_LT(held, whole + 4 * pg.world_size());
    EXPECT_EQ(accelerator.zero_optimizer()->group_parameter_names().size(), 1u);
  });
}

}  // namespace
}  // namespace tandem
