// OneCycle against DeepSpeed's formulas. With b = t + 1 (DeepSpeed evaluates
// one batch ahead), S1/S2 the half-cycle sizes and S = S1 + S2, inside the
// cycle (t < S):
//   scale = b <= S1 ? b / S1 : (S - b) / S2    (0 again at b = S)
//   stairs n > 0: scale = floor(position * n / half) / n
//   lr = min_lr + (max_lr - min_lr) * scale,  mom = max_mom - (max_mom - min_mom) * scale
// after it (t >= S), with i = (t - S + 1) / decay_step_size:
//   lr = min_lr / (1 + decay_lr_rate * i),    mom = max_mom * (1 + decay_mom_rate * i)
//   (no decay when decay_step_size or the rate is 0: lr = min_lr, mom = max_mom)
// At construction lr = min_lr and mom = min_mom.

#include <cmath>

#include <gtest/gtest.h>

#include "optim/scheduler_testing.h"
#include "tandem/core/error.h"
#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {
namespace {

using testing::expect_close;
using testing::group_lr;
using testing::group_options;
using testing::make_adamw;
using testing::make_grouped;

OneCycleOptions cycle(double min_lr, double max_lr, int64_t first_step_size) {
  OneCycleOptions options;
  options.cycle_min_lr = min_lr;
  options.cycle_max_lr = max_lr;
  options.cycle_first_step_size = first_step_size;
  return options;
}

double beta1(const torch::optim::Optimizer& optimizer, size_t group) {
  return std::get<0>(group_options<torch::optim::AdamOptions>(optimizer, group).betas());
}

double beta2(const torch::optim::Optimizer& optimizer, size_t group) {
  return std::get<1>(group_options<torch::optim::AdamOptions>(optimizer, group).betas());
}

TEST(OneCycle, LrRisesToMaxAndBackOverASymmetricCycleThenHoldsMin) {
  auto optimizer = make_adamw();
  OneCycleOptions options = cycle(0.1, 1.0, 4);
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  EXPECT_EQ(group_lr(*optimizer, 0), 0.1);
  for (int64_t t = 0; t <= 20; ++t) {
    scheduler.step();
    double b = t + 1.0;
    double scale = t < 8 ? (b <= 4 ? b / 4 : (8 - b) / 4) : 0.0;
    expect_close(group_lr(*optimizer, 0), 0.1 + 0.9 * scale, "t=" + std::to_string(t));
  }
}

TEST(OneCycle, PeakAndCycleEndBoundaries) {
  auto optimizer = make_adamw();
  OneCycleOptions options = cycle(0.1, 1.0, 4);
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  std::vector<double> lrs;
  for (int t = 0; t < 10; ++t) {
    scheduler.step();
    lrs.push_back(group_lr(*optimizer, 0));
  }
  EXPECT_DOUBLE_EQ(lrs[0], 0.325);  // b = 1: a quarter of the way up
  EXPECT_DOUBLE_EQ(lrs[3], 1.0);    // b = 4: the peak
  EXPECT_DOUBLE_EQ(lrs[4], 0.775);
  EXPECT_DOUBLE_EQ(lrs[7], 0.1);    // b = 8: back at the minimum, last cycle step
  EXPECT_DOUBLE_EQ(lrs[8], 0.1);    // decay phase, no decay configured
}

TEST(OneCycle, AsymmetricCycleUsesTheSecondStepSizeOnTheWayDown) {
  auto optimizer = make_adamw();
  OneCycleOptions options = cycle(0.0, 1.0, 2);
  options.cycle_second_step_size = 6;
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  for (int64_t t = 0; t < 8; ++t) {
    scheduler.step();
    double b = t + 1.0;
    double scale = b <= 2 ? b / 2 : (8 - b) / 6;
    expect_close(group_lr(*optimizer, 0), scale, "t=" + std::to_string(t));
  }
}

// cycle_second_step_size 0, which DeepSpeed allows: the cycle only rises,
// then the decay phase starts at the minimum (values from DeepSpeed 0.19.8's
// OneCycle with these settings).
TEST(OneCycle, AnEmptySecondHalfOnlyRises) {
  auto optimizer = make_adamw();
  OneCycleOptions options = cycle(0.0, 1.0, 4);
  options.cycle_second_step_size = 0;
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  const std::vector<double> expected = {0.25, 0.5, 0.75, 0.0, 0.0};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), expected[t]) << "t=" << t;
  }
}

TEST(OneCycle, StairsHoldTheLrFlatForEachStairOfTheCycle) {
  auto optimizer = make_adamw();
  OneCycleOptions options = cycle(0.0, 0.9, 6);
  options.cycle_first_stair_count = 3;  // the second half defaults to 3 too
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  // Stairs of 2 steps: scale = floor(b / 2) / 3 up, floor((12 - b) / 2) / 3 down.
  const std::vector<double> scale = {0.0,       1.0 / 3, 1.0 / 3, 2.0 / 3, 2.0 / 3, 1.0,
                                     2.0 / 3, 2.0 / 3, 1.0 / 3, 1.0 / 3, 0.0,     0.0};
  for (size_t t = 0; t < scale.size(); ++t) {
    scheduler.step();
    expect_close(group_lr(*optimizer, 0), 0.9 * scale[t], "t=" + std::to_string(t));
  }
}

TEST(OneCycle, SecondStairCountCanDifferFromTheFirst) {
  auto optimizer = make_adamw();
  OneCycleOptions options = cycle(0.0, 1.0, 4);
  options.cycle_first_stair_count = 2;
  options.cycle_second_stair_count = 0;  // continuous on the way down
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  // Up: floor(b * 2 / 4) / 2; down: (8 - b) / 4.
  const std::vector<double> expected = {0.0, 0.5, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    expect_close(group_lr(*optimizer, 0), expected[t], "t=" + std::to_string(t));
  }
}

TEST(OneCycle, DecayPhaseDividesLrAndScalesMomentumByTheDecayInterval) {
  auto optimizer = make_grouped<torch::optim::Adam>({0.5}, torch::optim::AdamOptions(0.5));
  OneCycleOptions options = cycle(0.2, 1.0, 2);  // cycle of 4 steps
  options.decay_step_size = 2;
  options.decay_lr_rate = 0.5;
  options.cycle_min_mom = 0.85;
  options.cycle_max_mom = 0.95;
  options.decay_mom_rate = 0.02;
  OneCycle scheduler(*optimizer, options);
  for (int t = 0; t < 4; ++t) scheduler.step();
  for (int64_t t = 4; t <= 12; ++t) {
    scheduler.step();
    double interval = (t - 4 + 1) / 2.0;
    expect_close(group_lr(*optimizer, 0), 0.2 / (1 + 0.5 * interval), "lr t=" + std::to_string(t));
    expect_close(beta1(*optimizer, 0), 0.95 * (1 + 0.02 * interval), "mom t=" + std::to_string(t));
  }
}

TEST(OneCycle, ZeroDecayRateHoldsLrAtMinAndMomentumAtMax) {
  auto optimizer = make_grouped<torch::optim::Adam>({0.5}, torch::optim::AdamOptions(0.5));
  OneCycleOptions options = cycle(0.2, 1.0, 2);
  options.decay_step_size = 2;  // a step size, but both rates 0
  OneCycle scheduler(*optimizer, options);
  for (int t = 0; t < 10; ++t) scheduler.step();
  EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), 0.2);
  EXPECT_DOUBLE_EQ(beta1(*optimizer, 0), 0.9);  // default cycle_max_mom
}

TEST(OneCycle, MomentumCyclesOppositeToLrOnAdamBeta1AndLeavesBeta2) {
  auto optimizer = make_grouped<torch::optim::Adam>(
      {0.5}, torch::optim::AdamOptions(0.5).betas(std::make_tuple(0.9, 0.98)));
  OneCycleOptions options = cycle(0.1, 1.0, 4);
  options.cycle_min_mom = 0.85;
  options.cycle_max_mom = 0.95;
  OneCycle scheduler(*optimizer, options);
  EXPECT_TRUE(scheduler.cycles_momentum());
  EXPECT_DOUBLE_EQ(beta1(*optimizer, 0), 0.85);  // DeepSpeed starts at the minimum
  EXPECT_DOUBLE_EQ(beta2(*optimizer, 0), 0.98);
  for (int64_t t = 0; t <= 12; ++t) {
    scheduler.step();
    double b = t + 1.0;
    double scale = t < 8 ? (b <= 4 ? b / 4 : (8 - b) / 4) : 0.0;
    expect_close(beta1(*optimizer, 0), 0.95 - 0.1 * scale, "t=" + std::to_string(t));
    EXPECT_DOUBLE_EQ(beta2(*optimizer, 0), 0.98);
  }
}

TEST(OneCycle, MomentumCyclesOnAdamWBeta1) {
  auto optimizer = make_adamw({0.5});
  OneCycleOptions options = cycle(0.1, 1.0, 4);
  OneCycle scheduler(*optimizer, options);
  for (int t = 0; t <= 3; ++t) scheduler.step();  // t = 3, b = 4: peak lr, minimum momentum
  EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), 1.0);
  const auto& adamw = group_options<torch::optim::AdamWOptions>(*optimizer, 0);
  EXPECT_DOUBLE_EQ(std::get<0>(adamw.betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(adamw.betas()), 0.999);
}

TEST(OneCycle, MomentumCyclesOnLionAndLambBeta1AndOnRmspropMomentum) {
  auto lion = make_grouped<Lion>({0.5}, LionOptions(0.5).betas({0.9, 0.99}));
  auto lamb = make_grouped<Lamb>({0.5}, LambOptions(0.5));
  auto rmsprop =
      make_grouped<torch::optim::RMSprop>({0.5}, torch::optim::RMSpropOptions(0.5).momentum(0.5));
  OneCycle lion_cycle(*lion, cycle(0.1, 1.0, 4));
  OneCycle lamb_cycle(*lamb, cycle(0.1, 1.0, 4));
  OneCycle rmsprop_cycle(*rmsprop, cycle(0.1, 1.0, 4));
  for (int t = 0; t <= 3; ++t) {  // t = 3: peak lr, minimum momentum
    lion_cycle.step();
    lamb_cycle.step();
    rmsprop_cycle.step();
  }
  EXPECT_DOUBLE_EQ(std::get<0>(group_options<LionOptions>(*lion, 0).betas()), 0.8);
  EXPECT_DOUBLE_EQ(std::get<1>(group_options<LionOptions>(*lion, 0).betas()), 0.99);
  EXPECT_DOUBLE_EQ(std::get<0>(group_options<LambOptions>(*lamb, 0).betas()), 0.8);
  EXPECT_DOUBLE_EQ(group_options<torch::optim::RMSpropOptions>(*rmsprop, 0).momentum(), 0.8);
}

TEST(OneCycle, MomentumCyclesOnSgdMomentumInEveryGroup) {
  auto optimizer = make_grouped<torch::optim::SGD>(
      {0.1, 0.2}, torch::optim::SGDOptions(0.1).momentum(0.5));
  OneCycleOptions options = cycle(0.01, 0.1, 2);
  options.cycle_min_mom = 0.8;
  options.cycle_max_mom = 0.9;
  OneCycle scheduler(*optimizer, options);
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_DOUBLE_EQ(group_options<torch::optim::SGDOptions>(*optimizer, g).momentum(), 0.8);
  }
  const std::vector<double> scale = {0.5, 1.0, 0.5, 0.0, 0.0};
  for (size_t t = 0; t < scale.size(); ++t) {
    scheduler.step();
    for (size_t g = 0; g < 2; ++g) {
      expect_close(group_lr(*optimizer, g), 0.01 + 0.09 * scale[t], "lr t=" + std::to_string(t));
      expect_close(group_options<torch::optim::SGDOptions>(*optimizer, g).momentum(),
                   0.9 - 0.1 * scale[t], "mom t=" + std::to_string(t));
    }
  }
}

TEST(OneCycle, OptimizerWithoutMomentumNeedsCycleMomentumFalse) {
  auto optimizer = make_grouped<torch::optim::Adagrad>({0.1}, torch::optim::AdagradOptions(0.1));
  try {
    OneCycle scheduler(*optimizer, cycle(0.01, 0.1, 2));
    FAIL() << "cycled momentum on Adagrad";
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("AdagradOptions"), std::string::npos) << what;
    EXPECT_NE(what.find("set cycle_momentum to false"), std::string::npos) << what;
  }
  OneCycleOptions options = cycle(0.01, 0.1, 2);
  options.cycle_momentum = false;
  OneCycle scheduler(*optimizer, options);
  scheduler.step();
  scheduler.step();
  EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), 0.1);
}

TEST(OneCycle, RejectsMissingLrBoundsAndBadSizes) {
  auto optimizer = make_adamw();
  OneCycleOptions no_max;
  no_max.cycle_min_lr = 0.1;
  try {
    OneCycle scheduler(*optimizer, no_max);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OneCycle needs cycle_max_lr"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(OneCycle(*optimizer, cycle(0.1, 1.0, 0)), UsageError);
  OneCycleOptions negative_stairs = cycle(0.1, 1.0, 4);
  negative_stairs.cycle_first_stair_count = -1;
  EXPECT_THROW(OneCycle(*optimizer, negative_stairs), UsageError);
  OneCycleOptions negative_decay = cycle(0.1, 1.0, 4);
  negative_decay.decay_step_size = -2;
  EXPECT_THROW(OneCycle(*optimizer, negative_decay), UsageError);
}

}  // namespace
}  // namespace tandem
