// Mixed precision through the Accelerator: loss scaling that skips an
// overflowing step on every rank, unscaling before clipping, bf16 autocast,
// and fp32 master weights for a bf16 model.

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/amp/autocast.h"

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


AcceleratorOptions scaled(double min_loss_scale = 1.0) {
  AcceleratorOptions options;
  LossScaleConfig scaling;  // torch's GradScaler rules: 2^16, backoff 0.5
  scaling.min_loss_scale = min_loss_scale;
  options.loss_scaling = scaling;
  return options;
}

std::vector<torch::Tensor> snapshot(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(AcceleratorScaler, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, scaled());
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto adam = std::make_shared<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    // A generator of its own: rank threads share torch's global one.
    auto gen = at::detail::createCPUGenerator(100 + pg.rank());
    auto step = [&](bool poison) {
      auto x = torch::randn({4, kIn}, gen);
      if (poison) x[0][0] = pg.rank() == 1 ? INFINITY : 1.0f;  // rank 1 only
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(x), torch::zeros({4, kOut})));
      optimizer->step();
    };
    step(false);
    ASSERT_EQ(accelerator.step(), 1);
    ASSERT_EQ(accelerator.loss_scale(), 65536.0);
    const auto before = snapshot(*model);
    step(true);
    EXPECT_TRUE(optimizer->step_was_skipped());
    EXPECT_TRUE(accelerator.optimizer_step_was_skipped());
    EXPECT_EQ(accelerator.step(), 1);
    EXPECT_EQ(accelerator.skipped_steps(), 1);
    EXPECT_EQ(accelerator.loss_scale(), 32768.0);
    const auto after = snapshot(*model);
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(torch::equal(before[i], after[i])) << "parameter " << i << " moved";
    }
    step(false);  // training resumes at the lower scale
    EXPECT_EQ(accelerator.step(), 2);
    EXPECT_FALSE(optimizer->step_was_skipped());
    EXPECT_FALSE(accelerator.optimizer_step_was_skipped());
  });
}

// Accelerate's optimizer_step_was_skipped reports overflows only: a
// micro-step that only accumulates leaves it as the last real step left it,
// while the optimizer's own step_was_skipped() says that step changed nothing.
TEST(AcceleratorScaler, OptimizerStepWasSkippedIsTheLastSynchronisingStepsOverflow) {
  const Mlp init = reference_init();
  AcceleratorOptions options = scaled();
  options.gradient_accumulation_steps = 2;
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(1e-2)));
    auto micro_step = [&](bool poison) {
      auto x = torch::ones({4, kIn});
      if (poison) x[0][0] = INFINITY;
      accelerator.backward(torch::mse_loss(model->forward(x), torch::zeros({4, kOut})));
      optimizer->step();
      optimizer->zero_grad();
    };
    micro_step(false);  // accumulates
    EXPECT_TRUE(optimizer->step_was_skipped());
    EXPECT_FALSE(accelerator.optimizer_step_was_skipped());
    micro_step(true);  // synchronises: an overflow
    EXPECT_TRUE(accelerator.optimizer_step_was_skipped());
    micro_step(false);  // accumulates: still the last real step's overflow
    EXPECT_TRUE(accelerator.optimizer_step_was_skipped());
    micro_step(false);  // synchronises: taken
    EXPECT_FALSE(optimizer->step_was_skipped());
    EXPECT_FALSE(accelerator.optimizer_step_was_skipped());
    EXPECT_EQ(accelerator.step(), 1);
  });
}

// Scaling by a power of two and unscaling again is exact in fp32, so scaled
// training must equal plain training; clip_grad_norm must see the true norm.
TEST(AcceleratorScaler, TheSchedulerDoesNotStepWhenAnOverflowSkippedTheStep) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, scaled());
    auto model = torch::nn::Linear(kIn, kOut);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(1.0));
    auto step_lr = std::make_shared<torch::optim::StepLR>(*sgd, 1, 0.5);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    auto scheduler = accelerator.prepare_scheduler(step_lr);
    for (bool poison : {false, true, false}) {
      auto x = torch::ones({2, kIn}) * (poison ? INFINITY : 1.0f);
      optimizer->zero_grad();
      accelerator.backward(model(x).sum());
      optimizer->step();
      scheduler->step();
    }
    EXPECT_EQ(accelerator.step(), 2);
    EXPECT_EQ(scheduler->steps(), 2);
  });
}

TEST(AcceleratorScaler, ScaledTrainingAndClippingEqualUnscaledTraining) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  constexpr int kWorld = 2, kSteps = 4;
  torch::manual_seed(9);
  const auto x = torch::randn({kSteps, kWorld * 4, kIn});
  const auto y = torch::randn({kSteps, kWorld * 4, kOut});
  std::vector<std::vector<double>> norms(2);
  std::vector<Mlp> trained(2, Mlp(kIn, kHidden, kOut));
  for (int with_scaling = 0; with_scaling < 2; ++with_scaling) {
    run_ranks(kWorld, [&](ProcessGroup& pg) {
      Accelerator accelerator(pg.shared_from_this(), Config{},
                              with_scaling ? scaled() : AcceleratorOptions{});
      Mlp model(kIn, kHidden, kOut);
      copy_state(*model, *init);
      auto sgd = std::make_shared<torch::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.5));
      accelerator.prepare_model(model);
      auto optimizer = accelerator.prepare_optimizer(sgd);
      for (int s = 0; s < kSteps; ++s) {
        optimizer->zero_grad();
        auto xs = x[s].narrow(0, pg.rank() * 4, 4), ys = y[s].narrow(0, pg.rank() * 4, 4);
        accelerator.backward(torch::mse_loss(model->forward(xs), ys));
        const double norm = accelerator.clip_grad_norm(0.05);
        optimizer->step();
        if (pg.rank() == 0) norms[with_scaling].push_back(norm);
      }
      if (pg.rank() == 0) trained[with_scaling] = model;
    });
  }
  ASSERT_EQ(norms[0].size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(norms[1][s], norms[0][s], 1e-6 * norms[0][s]);
  EXPECT_LT(max_relative_diff(*trained[1], *trained[0]), 1e-6);
}

TEST(AcceleratorScaler, ACollapsedScaleStopsWithTheKnobsToTurn) {
  run_ranks(1, [&](ProcessGroup& pg) {
    // Starting at the minimum, every step overflows: the scaler gives up.
    AcceleratorOptions options = scaled(65536.0);
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    auto model = torch::nn::Linear(kIn, kOut);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    auto x = torch::full({2, kIn}, INFINITY);
    try {
      for (int s = 0; s < 100; ++s) {
        optimizer->zero_grad();
        accelerator.backward(model(x).sum());
        optimizer->step();
      }
      FAIL() << "expected ScaleCollapseError";
    } catch (const ScaleCollapseError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("bf16"), std::string::npos) << what;
      EXPECT_NE(what.find("learning rate"), std::string::npos) << what;
    }
    EXPECT_EQ(accelerator.step(), 0);
  });
}

TEST(AcceleratorAutocast, Bf16RunsTheForwardInBf16AndBackwardInFp32) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  run_ranks(2, [&](ProcessGroup& pg) {
    Config config;
    config.mixed_precision = MixedPrecision::kBf16;
    Accelerator accelerator(pg.shared_from_this(), config);
    EXPECT_EQ(accelerator.loss_scale(), 1.0);
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    torch::Tensor out, loss;
    {
      auto autocast = accelerator.autocast();
      out = model->forward(torch::randn({4, kIn}));
      loss = torch::mse_loss(out, torch::zeros({4, kOut}));
    }
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    EXPECT_FALSE(is_autocast_enabled(c10::kCPU)) << "the guard must restore the state";
    accelerator.backward(loss);
    for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
    optimizer->step();
    EXPECT_EQ(accelerator.step(), 1);
  });
}

TEST(AcceleratorAutocast, Fp16OnTheCpuIsRefusedWithBf16Suggested) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Config config;
    config.mixed_precision = MixedPrecision::kFp16;
    try {
      Accelerator accelerator(pg.shared_from_this(), config);
      FAIL() << "expected UsageError";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    }
  });
}

// A bf16 model trains through fp32 master weights, so it tracks fp32
// training instead of losing updates smaller than bf16's spacing.
TEST(AcceleratorAmp, Bf16ModelTrainsThroughFp32MasterWeights) {
  // Built once, before the rank threads: they share torch's generator.
  const Mlp init = reference_init();
  torch::manual_seed(4);
  const auto x = torch::randn({16, kIn});
  const auto y = torch::randn({16, kOut});
  auto train = [&](bool bf16_model, Mlp& out) {
    run_ranks(2, [&](ProcessGroup& pg) {
      Config config;
      config.mixed_precision = bf16_model ? MixedPrecision::kBf16 : MixedPrecision::kNo;
      Accelerator accelerator(pg.shared_from_this(), config);
      Mlp model(kIn, kHidden, kOut);
      copy_state(*model, *init);
      if (bf16_model) model->to(torch::kBFloat16);
      auto adam = std::make_shared<torch::optim::Adam>(
          model->parameters(), torch::optim::AdamOptions(1e-4));
      accelerator.prepare_model(model);
      auto optimizer = accelerator.prepare_optimizer(adam);
      auto xs = x.narrow(0, pg.rank() * 8, 8), ys = y.narrow(0, pg.rank() * 8, 8);
      for (int s = 0; s < 30; ++s) {
        optimizer->zero_grad();
        torch::Tensor loss;
        {
          auto autocast = accelerator.autocast();
          loss = torch::mse_loss(model->forward(xs.to(model->fc1->weight.scalar_type())),
                                 ys.to(model->fc1->weight.scalar_type()));
        }
        accelerator.backward(loss);
        optimizer->step();
      }
      if (pg.rank() == 0) {
        model->to(torch::kFloat);
        out = model;
      }
    });
  };
  Mlp fp32(kIn, kHidden, kOut), bf16(kIn, kHidden, kOut);
  train(false, fp32);
  train(true, bf16);
  // 30 Adam steps of 1e-4 move weights by ~3e-3: far below what bf16 alone
  // (spacing ~4e-3 near 0.5) can represent step by step.
  const Mlp start = reference_init();
  double moved = 0, error = 0;
  auto start_params = start->named_parameters();
  auto bf16_params = bf16->named_parameters();
  for (const auto& item : fp32->named_parameters()) {
    moved += (item.value() - start_params[item.key()]).abs().sum().item<double>();
    error += (item.value() - bf16_params[item.key()]).abs().sum().item<double>();
  }
  EXPECT_GT(moved, 0.0);
  EXPECT_LT(error / moved, 0.25) << "bf16 training drifted from fp32: " << error << " vs " << moved;
}

}  // namespace
}  // namespace tandem
