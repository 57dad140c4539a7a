// WarmupLR and WarmupDecayLR against DeepSpeed's formulas:
//   W = max(2, warmup_num_steps), t = last_batch_iteration
//   gamma(t) = ln(t + 1) / ln(W) (log) or t / W (linear) while t < W
//   WarmupLR:      lr = min + (max - min) * (t < W ? gamma(t) : 1)
//   WarmupDecayLR: after warmup gamma = max(0, (T - t) / max(1, T - W))
//   before the first step (t = -1) lr = min.

#include <cmath>

#include <gtest/gtest.h>

#include "optim/scheduler_testing.h"
#include "tandem/core/error.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {
namespace {

using testing::expect_close;
using testing::group_lr;
using testing::make_adamw;

TEST(WarmupLR, ConstructionWritesMinLrAndCounterStartsAtMinusOne) {
  auto optimizer = make_adamw({0.5});
  WarmupLROptions options;
  options.warmup_min_lr = 0.01;
  options.warmup_max_lr = 0.1;
  WarmupLR scheduler(*optimizer, options);
  EXPECT_EQ(scheduler.last_batch_iteration(), -1);
  EXPECT_EQ(group_lr(*optimizer, 0), 0.01);
  EXPECT_EQ(scheduler.get_last_lr(), std::vector<double>{0.01});
  EXPECT_STREQ(scheduler.name(), "WarmupLR");
}

TEST(WarmupLR, LogWarmupFollowsLnOfStepPlusOneOverLnWThenHoldsMax) {
  auto optimizer = make_adamw();
  WarmupLROptions options;
  options.warmup_min_lr = 0.01;
  options.warmup_max_lr = 0.1;
  options.warmup_num_steps = 10;
  WarmupLR scheduler(*optimizer, options);
  for (int64_t t = 0; t <= 15; ++t) {
    scheduler.step();
    ASSERT_EQ(scheduler.last_batch_iteration(), t);
    double expected = t < 10 ? 0.01 + 0.09 * std::log(t + 1.0) / std::log(10.0) : 0.1;
    expect_close(group_lr(*optimizer, 0), expected, "t=" + std::to_string(t));
    expect_close(scheduler.get_last_lr().at(0), expected, "get_last_lr t=" + std::to_string(t));
  }
}

TEST(WarmupLR, LogWarmupStartsAtMinAndReachesMaxOneStepBeforeW) {
  auto optimizer = make_adamw();
  WarmupLROptions options;
  options.warmup_min_lr = 0.0;
  options.warmup_max_lr = 1.0;
  options.warmup_num_steps = 4;
  WarmupLR scheduler(*optimizer, options);
  scheduler.step();  // t = 0: ln(1) = 0
  EXPECT_EQ(group_lr(*optimizer, 0), 0.0);
  scheduler.step();  // t = 1: ln 2 / ln 4 = 1/2
  expect_close(group_lr(*optimizer, 0), 0.5, "t=1");
  scheduler.step();
  scheduler.step();  // t = 3: ln 4 / ln 4 = 1
  expect_close(group_lr(*optimizer, 0), 1.0, "t=3");
  scheduler.step();  // t = 4 = W: held
  EXPECT_EQ(group_lr(*optimizer, 0), 1.0);
}

TEST(WarmupLR, LinearWarmupIsStepOverWAndReachesMaxAtW) {
  auto optimizer = make_adamw();
  WarmupLROptions options;
  options.warmup_min_lr = 0.0;
  options.warmup_max_lr = 1.0;
  options.warmup_num_steps = 4;
  options.warmup_type = WarmupType::kLinear;
  WarmupLR scheduler(*optimizer, options);
  const std::vector<double> expected = {0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), expected[t]) << "t=" << t;
  }
}

TEST(WarmupLR, OneWarmupStepIsStretchedToTwo) {
  auto optimizer = make_adamw();
  WarmupLROptions options;
  options.warmup_min_lr = 0.2;
  options.warmup_max_lr = 1.0;
  options.warmup_num_steps = 1;  // DeepSpeed: max(2, 1) = 2
  options.warmup_type = WarmupType::kLinear;
  WarmupLR scheduler(*optimizer, options);
  const std::vector<double> expected = {0.2, 0.6, 1.0, 1.0};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), expected[t]) << "t=" << t;
  }
}

// DeepSpeed: warmup_max_lr = [group['lr'] for group in param_groups].
TEST(WarmupLR, MaxLrDefaultsToEachGroupsOwnLr) {
  auto optimizer = make_adamw({0.05, 0.7});
  WarmupLROptions options;
  options.warmup_min_lr = 0.01;
  options.warmup_num_steps = 2;
  options.warmup_type = WarmupType::kLinear;
  WarmupLR scheduler(*optimizer, options);
  EXPECT_DOUBLE_EQ(group_lr(*optimizer, 1), 0.01) << "before the first step: the minimum";
  const std::vector<double> first = {0.01, 0.03, 0.05, 0.05};
  const std::vector<double> second = {0.01, 0.355, 0.7, 0.7};
  for (size_t t = 0; t < first.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), first[t]) << "t=" << t;
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 1), second[t]) << "t=" << t;
  }
}

TEST(WarmupLR, WritesTheSameLrIntoEveryParamGroup) {
  auto optimizer = make_adamw({0.1, 0.2, 0.3});
  WarmupLROptions options;
  options.warmup_min_lr = 0.0;
  options.warmup_max_lr = 0.4;
  options.warmup_num_steps = 4;
  options.warmup_type = WarmupType::kLinear;
  WarmupLR scheduler(*optimizer, options);
  scheduler.step();
  scheduler.step();  // t = 1: 0.4 * 1/4
  EXPECT_EQ(scheduler.get_last_lr(), (std::vector<double>{0.1, 0.1, 0.1}));
  for (size_t g = 0; g < 3; ++g) EXPECT_DOUBLE_EQ(group_lr(*optimizer, g), 0.1);
}

TEST(WarmupLR, RejectsNonPositiveWarmupSteps) {
  auto optimizer = make_adamw();
  for (int64_t steps : {0, -3}) {
    WarmupLROptions options;
    options.warmup_num_steps = steps;
    try {
      WarmupLR scheduler(*optimizer, options);
      FAIL() << "accepted warmup_num_steps " << steps;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("warmup_num_steps must be a positive"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(WarmupLR, StepFailsWhenParamGroupsWereAddedAfterConstruction) {
  auto optimizer = make_adamw();
  WarmupLR scheduler(*optimizer);
  optimizer->add_param_group(
      torch::optim::OptimizerParamGroup(std::vector<torch::Tensor>{testing::make_param()}));
  try {
    scheduler.step();
    FAIL() << "step() accepted a changed number of param groups";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 2 param groups but the scheduler was built for 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(WarmupType, ParsesLogAndLinearOnly) {
  EXPECT_EQ(parse_warmup_type("log"), WarmupType::kLog);
  EXPECT_EQ(parse_warmup_type("linear"), WarmupType::kLinear);
  EXPECT_STREQ(to_string(WarmupType::kLinear), "linear");
  EXPECT_THROW(parse_warmup_type("liner"), UsageError);
  EXPECT_THROW(parse_warmup_type("cosine"), UsageError);
}

TEST(WarmupDecayLR, LinearWarmupThenLinearDecayReachesZeroAtTotalAndStays) {
  auto optimizer = make_adamw();
  WarmupDecayLROptions options;
  options.total_num_steps = 12;
  options.warmup_min_lr = 0.0;
  options.warmup_max_lr = 1.0;
  options.warmup_num_steps = 4;
  options.warmup_type = WarmupType::kLinear;
  WarmupDecayLR scheduler(*optimizer, options);
  EXPECT_EQ(group_lr(*optimizer, 0), 0.0);
  // t:        0    1     2    3     4    5      6     7      8    9      10    11     12   13  14
  const std::vector<double> expected = {0.0,   0.25, 0.5,   0.75, 1.0, 0.875, 0.75, 0.625,
                                        0.5,   0.375, 0.25, 0.125, 0.0, 0.0,  0.0};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), expected[t]) << "t=" << t;
  }
}

TEST(WarmupDecayLR, LogWarmupThenDecayMatchesClosedForm) {
  auto optimizer = make_adamw();
  WarmupDecayLROptions options;
  options.total_num_steps = 30;
  options.warmup_min_lr = 0.001;
  options.warmup_max_lr = 0.01;
  options.warmup_num_steps = 10;
  WarmupDecayLR scheduler(*optimizer, options);
  for (int64_t t = 0; t <= 35; ++t) {
    scheduler.step();
    double gamma = t < 10 ? std::log(t + 1.0) / std::log(10.0)
                          : std::max(0.0, (30.0 - t) / 20.0);
    expect_close(group_lr(*optimizer, 0), 0.001 + 0.009 * gamma, "t=" + std::to_string(t));
  }
}

TEST(WarmupDecayLR, MaxLrDefaultsToDeepSpeeds0_001NotTheOptimizersLr) {
  auto optimizer = make_adamw({0.5});
  WarmupDecayLROptions options;
  options.total_num_steps = 100;
  options.warmup_num_steps = 2;
  options.warmup_type = WarmupType::kLinear;
  WarmupDecayLR scheduler(*optimizer, options);
  scheduler.step();
  scheduler.step();
  scheduler.step();  // t = 2 = W: gamma = (100 - 2) / 98 = 1
  EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), 0.001);
}

TEST(WarmupDecayLR, TotalBelowWarmupDropsToZeroRightAfterWarmup) {
  auto optimizer = make_adamw();
  WarmupDecayLROptions options;
  options.total_num_steps = 3;
  options.warmup_max_lr = 1.0;
  options.warmup_num_steps = 5;
  options.warmup_type = WarmupType::kLinear;
  WarmupDecayLR scheduler(*optimizer, options);
  // After warmup: max(0, (3 - t) / max(1, 3 - 5)) = 0.
  const std::vector<double> expected = {0.0, 0.2, 0.4, 0.6, 0.8, 0.0, 0.0};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), expected[t]) << "t=" << t;
  }
}

TEST(WarmupDecayLR, RequiresAPositiveTotalNumSteps) {
  auto optimizer = make_adamw({0.3});
  WarmupDecayLROptions options;
  try {
    WarmupDecayLR scheduler(*optimizer, options);
    FAIL() << "accepted a missing total_num_steps";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("WarmupDecayLR needs total_num_steps"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(group_lr(*optimizer, 0), 0.3) << "a rejected scheduler must not touch the optimizer";
  options.total_num_steps = -1;
  EXPECT_THROW(WarmupDecayLR(*optimizer, options), UsageError);
}

// total_num_steps 0, which DeepSpeed takes: the decay is over as the warmup
// ends, so after it the lr is the minimum.
TEST(WarmupDecayLR, ZeroTotalStepsDecaysToTheMinimumAfterTheWarmup) {
  auto optimizer = make_adamw({0.3});
  WarmupDecayLROptions options;
  options.total_num_steps = 0;
  options.warmup_min_lr = 0.01;
  options.warmup_max_lr = 0.1;
  options.warmup_num_steps = 2;
  options.warmup_type = WarmupType::kLinear;
  WarmupDecayLR scheduler(*optimizer, options);
  const std::vector<double> expected = {0.01, 0.055, 0.01, 0.01};
  for (size_t t = 0; t < expected.size(); ++t) {
    scheduler.step();
    EXPECT_DOUBLE_EQ(group_lr(*optimizer, 0), expected[t]) << "t=" << t;
  }
}

}  // namespace
}  // namespace tandem
