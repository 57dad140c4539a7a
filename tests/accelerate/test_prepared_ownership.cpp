// What prepare() hands back: one optimizer handle that is a
// torch::optim::Optimizer, objects that share ownership (no "must outlive"
// rule), and the optimizer passed to prepare refused when used behind the
// Accelerator's back.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

using tandem::testing::usage_error_message;

namespace tandem {
namespace {

using testing::copy_state;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::max_relative_diff;
using testing::Mlp;
using testing::reference_init;
using testing::run_ranks;

using Data = testing::Dataset;
using testing::config_with_accumulation;

Data make_data(int64_t n) { return testing::make_dataset(n, /*seed=*/21); }

// One rank, the model prepared with SGD; returns the raw optimizer too.
struct Prepared {
  std::shared_ptr<Accelerator> accelerator;
  Mlp model{kIn, kHidden, kOut};
  std::shared_ptr<torch::optim::SGD> raw;
  std::shared_ptr<AcceleratedOptimizer> optimizer;
  Data data = make_data(8);

  explicit Prepared(ProcessGroup& pg, int64_t accumulation = 1) {
    accelerator = std::make_shared<Accelerator>(
        pg.shared_from_this(), config_with_accumulation(accumulation));
    copy_state(*model, *reference_init());
    raw = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    accelerator->prepare_model(model);
    optimizer = accelerator->prepare_optimizer(raw);
  }
  void backward() {
    accelerator->backward(torch::mse_loss(model->forward(data.x), data.y));
  }
};

TEST(PreparedOptimizer, IsATorchOptimizerWithTheLiveParamGroupsAndState) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Prepared p(pg);
    torch::optim::Optimizer& base = *p.optimizer;
    ASSERT_EQ(base.param_groups().size(), 1u);
    EXPECT_EQ(base.param_groups()[0].params().size(), p.model->parameters().size());
    EXPECT_TRUE(base.param_groups()[0].params()[0].is_same(p.model->parameters()[0]));
    // Stepped through the base class, the update still runs (virtual step).
    const auto before = p.model->parameters()[0].clone();
    p.optimizer->zero_grad();
    p.backward();
    base.step();
    EXPECT_FALSE(torch::equal(before, p.model->parameters()[0]));
    EXPECT_EQ(p.accelerator->step(), 1);
  });
}

// Through a torch::optim::Optimizer& at 2 ranks with accumulation 2, DDP and
// ZeRO 1: step() (virtual) and zero_grad() (not virtual; it clears every
// gradient) called only where zeroing is right, at accumulation boundaries,
// train exactly as the prepared optimizer's own calls.
TEST(PreparedOptimizer, StepAndZeroGradThroughTheBaseClassAtBoundariesTrainTheSame) {
  for (int stage : {0, 1}) {
    const Mlp init = reference_init();  // before the rank threads: it seeds the global generator
    const Data data = make_data(32);
    auto train = [&](bool through_base) {
      std::vector<torch::Tensor> out(2);
      run_ranks(2, [&](ProcessGroup& pg) {
        Config config = config_with_accumulation(2);
        config.zero.stage = stage;
        auto accelerator = std::make_shared<Accelerator>(pg.shared_from_this(), config);
        Mlp model(kIn, kHidden, kOut);
        copy_state(*model, *init);
        auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                       torch::optim::SGDOptions(0.1).momentum(0.9));
        accelerator->prepare_model(model);
        auto optimizer = accelerator->prepare_optimizer(sgd);
        torch::optim::Optimizer& base = *optimizer;
        for (int micro = 0; micro < 8; ++micro) {
          auto x = data.x.narrow(0, micro * 4 + pg.rank() * 2, 2);
          auto y = data.y.narrow(0, micro * 4 + pg.rank() * 2, 2);
          const bool boundary = micro % 2 == 0;
          if (boundary) through_base ? base.zero_grad() : optimizer->zero_grad();
          accelerator->backward(torch::mse_loss(model->forward(x), y));
          through_base ? (void)base.step() : (void)optimizer->step();
        }
        EXPECT_EQ(accelerator->step(), 4);
        out[pg.rank()] = torch::cat({model->fc1->weight.flatten(), model->fc3->bias});
      });
      return out;
    };
    const auto own = train(false), through_base = train(true);
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(torch::equal(own[r], through_base[r])) << "stage " << stage << " rank " << r;
    }
  }
}

// zero_grad() through the base class in the middle of accumulation clears
// the gradients of the first micro-batch: the next backward refuses, naming
// the cause, instead of stepping on half the sum.
TEST(PreparedOptimizer, ZeroGradThroughTheBaseClassMidAccumulationIsRefusedNotLost) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Prepared p(pg, /*accumulation=*/2);
    torch::optim::Optimizer& base = *p.optimizer;
    p.optimizer->zero_grad();
    p.backward();  // micro-step 1 of 2: gradients pending
    base.zero_grad();
    const std::string message = usage_error_message([&] { p.backward(); });
    EXPECT_NE(message.find("cleared outside tandem"), std::string::npos) << message;
    EXPECT_NE(message.find("optimizer->zero_grad()"), std::string::npos) << message;
  });
}

TEST(PreparedOptimizer, SteppingTheRawOptimizerIsRefusedAndChangesNothing) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Prepared p(pg);
    p.optimizer->zero_grad();
    p.backward();
    const auto before = p.model->parameters()[0].clone();
    p.raw->step();  // behind the Accelerator's back
    EXPECT_TRUE(torch::equal(before, p.model->parameters()[0])) << "no parameter may move";
    const std::string message = usage_error_message([&] { p.optimizer->step(); });
    EXPECT_NE(message.find("stepped directly"), std::string::npos) << message;
    EXPECT_NE(message.find("optimizer->step()"), std::string::npos) << message;
    EXPECT_THROW(p.backward(), UsageError) << "the next backward refuses too";
  });
}

TEST(PreparedOptimizer, ZeroingTheRawOptimizerIsRefused) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Prepared p(pg);
    p.raw->zero_grad();
    const std::string message = usage_error_message([&] { p.optimizer->zero_grad(); });
    EXPECT_NE(message.find("zeroed directly"), std::string::npos) << message;
  });
}

TEST(PreparedOptimizer, ASchedulerBuiltOverTheRawOptimizerStillSetsTheLearningRate) {
  // Each rank thread trains twice: with the scheduler over the raw optimizer
  // (built before prepare, as loops written for LibTorch do) and over the
  // prepared one. The learning rates and weights must agree step by step.
  run_ranks(1, [&](ProcessGroup& pg) {
    std::vector<double> lrs[2];
    Mlp trained[2] = {Mlp(kIn, kHidden, kOut), Mlp(kIn, kHidden, kOut)};
    for (int over_raw = 0; over_raw < 2; ++over_raw) {
      Accelerator accelerator(pg.shared_from_this(), Config{});
      Mlp& model = trained[over_raw];
      copy_state(*model, *reference_init());
      auto raw = std::make_shared<torch::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.1));
      std::shared_ptr<torch::optim::StepLR> schedule;
      if (over_raw) schedule = std::make_shared<torch::optim::StepLR>(*raw, 1, 0.5);
      const Data data = make_data(8);
      auto [optimizer, loader] = accelerator.prepare(model, raw, {data.x, data.y}, 2);
      if (!over_raw) schedule = std::make_shared<torch::optim::StepLR>(*optimizer, 1, 0.5);
      auto scheduler = accelerator.prepare_scheduler(schedule);
      for (auto& batch : *loader) {
        optimizer->zero_grad();
        accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
        optimizer->step();
        scheduler->step();
        lrs[over_raw].push_back(optimizer->param_groups()[0].options().get_lr());
      }
    }
    EXPECT_EQ(lrs[0], lrs[1]);
    EXPECT_LT(max_relative_diff(*trained[0], *trained[1]), 1e-7);
  });
}

TEST(PreparedObjects, KeepTrainingAfterTheAcceleratorIsGone) {
  // DDP over 2 ranks, accumulation 2: the loader, optimizer and scheduler
  // keep the micro-step state and the DDP wrapper alive by themselves.
  const Mlp init = reference_init();
  const Data data = make_data(16);
  std::vector<torch::Tensor> weights(2);
  run_ranks(2, [&](ProcessGroup& pg) {
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto accelerator = std::make_unique<Accelerator>(pg.shared_from_this(), config_with_accumulation(1));
    auto raw = std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1));
    auto [optimizer, loader] = accelerator->prepare(model, raw, {data.x, data.y}, 2);
    raw.reset();
    accelerator.reset();
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      torch::mse_loss(model->forward(batch[0]), batch[1]).backward();
      optimizer->step();
    }
    EXPECT_EQ(optimizer->state().size(), 0u) << "plain SGD keeps no state";
    weights[pg.rank()] = model->parameters()[0].detach().clone();
  });
  // The gradients were still all-reduced: both ranks hold the same weights.
  EXPECT_TRUE(torch::equal(weights[0], weights[1]));
}

TEST(PreparedObjects, AccumulateRefusesAModelThatWasNotPrepared) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Prepared p(pg);
    Mlp other(kIn, kHidden, kOut);
    EXPECT_THROW((void)p.accelerator->accumulate(other), UsageError);
    auto guard = p.accelerator->accumulate(p.model);
    EXPECT_TRUE(p.accelerator->gradient_state().in_accumulate_guard);
  });
}

TEST(PreparedObjects, GradientStateIsASnapshot) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Prepared p(pg, /*accumulation=*/2);
    const GradientState before = p.accelerator->gradient_state();
    p.backward();
    EXPECT_EQ(before.micro_step, 0);
    EXPECT_TRUE(before.sync_gradients);
    EXPECT_EQ(p.accelerator->gradient_state().micro_step, 1);
    EXPECT_FALSE(p.accelerator->gradient_state().sync_gradients);
  });
}

TEST(PreparedOptimizer, TorchSaveAndLoadRoundTripTheWrappedState) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *reference_init());
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(), 1e-2);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    const Data data = make_data(8);
    optimizer->zero_grad();
    accelerator.backward(torch::mse_loss(model->forward(data.x), data.y));
    optimizer->step();
    ASSERT_EQ(optimizer->state().size(), model->parameters().size());
    std::stringstream buffer;
    torch::save(*optimizer, buffer);
    auto fresh = std::make_shared<torch::optim::Adam>(model->parameters(), 1e-2);
    torch::load(*fresh, buffer);
    ASSERT_EQ(fresh->state().size(), optimizer->state().size());
    void* key = model->parameters()[0].unsafeGetTensorImpl();
    const auto& saved = static_cast<torch::optim::AdamParamState&>(*optimizer->state().at(key));
    const auto& loaded = static_cast<torch::optim::AdamParamState&>(*fresh->state().at(key));
    EXPECT_EQ(saved.step(), loaded.step());
    EXPECT_TRUE(torch::equal(saved.exp_avg(), loaded.exp_avg()));
  });
}

}  // namespace
}  // namespace tandem
