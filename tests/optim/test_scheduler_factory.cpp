// make_lr_scheduler(): DeepSpeed scheduler blocks, "auto" values and errors.

#include <cmath>

#include <gtest/gtest.h>

#include "optim/scheduler_testing.h"
#include "tandem/core/error.h"
#include "tandem/optim/lr_scheduler.h"
#include "support/usage_error.h"

using tandem::testing::usage_error_message;

namespace tandem {
namespace {

using testing::expect_close;
using testing::group_lr;
using testing::group_options;
using testing::make_adamw;
using testing::make_grouped;

SchedulerConfig block(const std::string& type, std::map<std::string, double> params = {},
                      std::set<std::string> auto_params = {}, std::string warmup_type = "") {
  SchedulerConfig config;
  config.type = type;
  config.params = std::move(params);
  config.auto_params = std::move(auto_params);
  config.warmup_type = std::move(warmup_type);
  return config;
}

std::vector<double> lr_sequence(LRScheduler& scheduler, const torch::optim::Optimizer& optimizer,
                                int steps) {
  std::vector<double> lrs;
  for (int i = 0; i < steps; ++i) {
    scheduler.step();
    lrs.push_back(group_lr(optimizer, 0));
  }
  return lrs;
}

TEST(MakeLRScheduler, BuildsEachDeepSpeedTypeByName) {
  auto optimizer = make_adamw({0.1});
  EXPECT_STREQ(make_lr_scheduler(block("WarmupLR"), *optimizer)->name(), "WarmupLR");
  EXPECT_STREQ(make_lr_scheduler(block("WarmupDecayLR", {{"total_num_steps", 10}}), *optimizer)
                   ->name(),
               "WarmupDecayLR");
  EXPECT_STREQ(make_lr_scheduler(block("WarmupCosineLR", {{"total_num_steps", 10}}), *optimizer)
                   ->name(),
               "WarmupCosineLR");
  EXPECT_STREQ(
      make_lr_scheduler(block("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}}),
                        *optimizer)
          ->name(),
      "OneCycle");
  EXPECT_EQ(lr_scheduler_types(),
            (std::vector<std::string>{"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle"}));
}

TEST(MakeLRScheduler, EmptyWarmupLRBlockUsesDeepSpeedDefaults) {
  auto optimizer = make_adamw({0.06});
  auto scheduler = make_lr_scheduler(block("WarmupLR"), *optimizer);
  // min 0, max = the optimizer's lr, 1000 log-warmup steps.
  auto lrs = lr_sequence(*scheduler, *optimizer, 2);
  EXPECT_EQ(lrs[0], 0.0);
  expect_close(lrs[1], 0.06 * std::log(2.0) / std::log(1000.0), "t=1");
}

TEST(MakeLRScheduler, ParamsAndWarmupTypeDriveTheSchedule) {
  auto optimizer = make_adamw();
  auto scheduler = make_lr_scheduler(block("WarmupDecayLR",
                                           {{"total_num_steps", 12},
                                            {"warmup_min_lr", 0},
                                            {"warmup_max_lr", 1},
                                            {"warmup_num_steps", 4}},
                                           {}, "linear"),
                                     *optimizer);
  EXPECT_EQ(lr_sequence(*scheduler, *optimizer, 14),
            (std::vector<double>{0.0, 0.25, 0.5, 0.75, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25,
                                 0.125, 0.0, 0.0}));
}

TEST(MakeLRScheduler, AutoParamsTakeTheSuppliedValues) {
  auto optimizer = make_adamw({0.5});
  auto scheduler = make_lr_scheduler(
      block("WarmupDecayLR", {{"warmup_num_steps", 2}}, {"warmup_max_lr", "total_num_steps"},
            "linear"),
      *optimizer, {{"warmup_max_lr", 0.8}, {"total_num_steps", 4}, {"cycle_max_lr", 7}});
  // W = 2, T = 4, max 0.8: warmup 0, 0.4; decay (4 - t) / 2 * 0.8.
  EXPECT_EQ(lr_sequence(*scheduler, *optimizer, 6),
            (std::vector<double>{0.0, 0.4, 0.8, 0.4, 0.0, 0.0}));
}

TEST(MakeLRScheduler, ExplicitConfigValuesBeatAutoValues) {
  auto optimizer = make_adamw();
  auto scheduler = make_lr_scheduler(
      block("WarmupLR", {{"warmup_max_lr", 1.0}, {"warmup_num_steps", 2}}, {}, "linear"),
      *optimizer, {{"warmup_max_lr", 99.0}, {"warmup_num_steps", 50}});
  EXPECT_EQ(lr_sequence(*scheduler, *optimizer, 3), (std::vector<double>{0.0, 0.5, 1.0}));
}

TEST(MakeLRScheduler, AutoParamWithoutValueNamesItAndHowToSetIt) {
  auto optimizer = make_adamw({0.3});
  std::string what = usage_error_message([&] {
    make_lr_scheduler(block("WarmupCosineLR", {}, {"total_num_steps"}), *optimizer,
                      {{"warmup_max_lr", 0.1}});
  });
  EXPECT_NE(what.find("scheduler.params.total_num_steps of WarmupCosineLR is \"auto\""),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("auto_values"), std::string::npos) << what;
  EXPECT_NE(what.find("max training steps"), std::string::npos) << what;
  EXPECT_EQ(group_lr(*optimizer, 0), 0.3) << "a failed build must not touch the optimizer";
}

TEST(MakeLRScheduler, UnknownTypeSuggestsTheClosestAndListsAll) {
  auto optimizer = make_adamw();
  std::string what = usage_error_message([&] { make_lr_scheduler(block("WarmupCosine"), *optimizer); });
  EXPECT_NE(what.find("scheduler.type 'WarmupCosine' is not a known scheduler, did you mean "
                      "'WarmupCosineLR'?"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("valid types: WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle"),
            std::string::npos)
      << what;
  what = usage_error_message([&] { make_lr_scheduler(block("warmuplr"), *optimizer); });
  EXPECT_NE(what.find("did you mean 'WarmupLR'?"), std::string::npos) << what;
  what = usage_error_message([&] { make_lr_scheduler(block("StepLR"), *optimizer); });
  EXPECT_EQ(what.find("did you mean"), std::string::npos) << what;
  EXPECT_NE(what.find("valid types: WarmupLR"), std::string::npos) << what;
}

TEST(MakeLRScheduler, LRRangeTestAndEmptyTypeAreUsageErrors) {
  auto optimizer = make_adamw();
  std::string what = usage_error_message([&] { make_lr_scheduler(block("LRRangeTest"), *optimizer); });
  EXPECT_NE(what.find("LRRangeTest"), std::string::npos) << what;
  EXPECT_NE(what.find("not implemented"), std::string::npos) << what;
  what = usage_error_message([&] { make_lr_scheduler(block(""), *optimizer); });
  EXPECT_NE(what.find("no type"), std::string::npos) << what;
}

TEST(MakeLRScheduler, UnknownParamSuggestsTheClosestAndListsTheTypesParams) {
  auto optimizer = make_adamw();
  std::string what = usage_error_message([&] {
    make_lr_scheduler(block("WarmupLR", {{"warmup_num_stpes", 10}}), *optimizer);
  });
  EXPECT_NE(what.find("scheduler.params.warmup_num_stpes is not a WarmupLR parameter, did you "
                      "mean 'warmup_num_steps'?"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("WarmupLR takes: warmup_min_lr, warmup_max_lr, warmup_num_steps and "
                      "warmup_type"),
            std::string::npos)
      << what;
  // A valid parameter of another scheduler is still unknown here.
  what = usage_error_message([&] {
    make_lr_scheduler(block("WarmupLR", {}, {"total_num_steps"}), *optimizer,
                      {{"total_num_steps", 10}});
  });
  EXPECT_NE(what.find("total_num_steps is not a WarmupLR parameter"), std::string::npos) << what;
}

TEST(MakeLRScheduler, StepCountsMustBeIntegers) {
  auto optimizer = make_adamw();
  std::string what = usage_error_message([&] {
    make_lr_scheduler(block("WarmupLR", {{"warmup_num_steps", 10.5}}), *optimizer);
  });
  EXPECT_NE(what.find("warmup_num_steps counts optimizer steps and must be an integer"),
            std::string::npos)
      << what;
  what = usage_error_message([&] {
    make_lr_scheduler(block("WarmupCosineLR", {}, {"total_num_steps"}), *optimizer,
                      {{"total_num_steps", 1e300}});
  });
  EXPECT_NE(what.find("must be an integer"), std::string::npos) << what;
}

TEST(MakeLRScheduler, WarmupTypeMustBeLogOrLinearAndIsNotForOneCycle) {
  auto optimizer = make_adamw();
  std::string what = usage_error_message(
      [&] { make_lr_scheduler(block("WarmupLR", {}, {}, "cosine"), *optimizer); });
  EXPECT_NE(what.find("warmup_type 'cosine' is not valid"), std::string::npos) << what;
  what = usage_error_message([&] {
    make_lr_scheduler(block("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}}, {}, "log"),
                      *optimizer);
  });
  EXPECT_NE(what.find("does not apply to OneCycle"), std::string::npos) << what;
}

TEST(MakeLRScheduler, OneCycleBlockBuildsTheCycleAndItsMomentum) {
  auto optimizer = make_grouped<torch::optim::SGD>({0.1}, torch::optim::SGDOptions(0.1));
  auto scheduler = make_lr_scheduler(block("OneCycle", {{"cycle_min_lr", 0.0},
                                                        {"cycle_max_lr", 1.0},
                                                        {"cycle_first_step_size", 2},
                                                        {"cycle_second_step_size", 2},
                                                        {"cycle_min_mom", 0.5},
                                                        {"cycle_max_mom", 0.9}}),
                                     *optimizer);
  EXPECT_EQ(lr_sequence(*scheduler, *optimizer, 5), (std::vector<double>{0.5, 1.0, 0.5, 0.0, 0.0}));
  EXPECT_DOUBLE_EQ(group_options<torch::optim::SGDOptions>(*optimizer, 0).momentum(), 0.9);
}

TEST(MakeLRScheduler, CycleMomentumIsAFlag) {
  auto optimizer = make_grouped<torch::optim::Adagrad>({0.1}, torch::optim::AdagradOptions(0.1));
  auto scheduler = make_lr_scheduler(
      block("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}, {"cycle_momentum", 0}}),
      *optimizer);
  EXPECT_EQ(group_lr(*optimizer, 0), 0.01);
  std::string what = usage_error_message([&] {
    make_lr_scheduler(
        block("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1}, {"cycle_momentum", 2}}),
        *optimizer);
  });
  EXPECT_NE(what.find("cycle_momentum must be true or false"), std::string::npos) << what;
}

// DeepSpeed's last_batch_iteration: a scheduler built at counter N is where a
// fresh one is after N + 1 steps, and goes on from there, for every type
// (WarmupCosineLR's initial lrs and a WarmupLR's peaks are the groups' own).
TEST(MakeLRScheduler, LastBatchIterationContinuesTheScheduleAfterThatStep) {
  const std::vector<SchedulerConfig> blocks = {
      block("WarmupLR", {{"warmup_num_steps", 10}}),
      block("WarmupDecayLR", {{"warmup_num_steps", 4}, {"total_num_steps", 30}}),
      block("WarmupCosineLR", {{"warmup_num_steps", 4}, {"total_num_steps", 30}}),
      block("OneCycle", {{"cycle_min_lr", 0.01}, {"cycle_max_lr", 0.1},
                         {"cycle_first_step_size", 5}})};
  for (SchedulerConfig config : blocks) {
    SCOPED_TRACE(config.type);
    auto fresh_optimizer = make_adamw({0.1, 0.03});
    auto fresh = make_lr_scheduler(config, *fresh_optimizer);
    for (int i = 0; i < 8; ++i) fresh->step();  // counter 7
    config.params["last_batch_iteration"] = 7;
    auto optimizer = make_adamw({0.1, 0.03});
    auto resumed = make_lr_scheduler(config, *optimizer);
    EXPECT_EQ(resumed->last_batch_iteration(), 7);
    EXPECT_EQ(group_lr(*optimizer, 1), group_lr(*fresh_optimizer, 1));
    EXPECT_EQ(lr_sequence(*resumed, *optimizer, 12), lr_sequence(*fresh, *fresh_optimizer, 12));
  }
  SchedulerConfig minus_one = blocks[0];
  minus_one.params["last_batch_iteration"] = -1;  // DeepSpeed's default: from the start
  auto optimizer = make_adamw({0.1});
  EXPECT_EQ(make_lr_scheduler(minus_one, *optimizer)->last_batch_iteration(), -1);
  SchedulerConfig bad = blocks[0];
  bad.params["last_batch_iteration"] = -3;
  EXPECT_NE(usage_error_message([&] { make_lr_scheduler(bad, *optimizer); })
                .find("last_batch_iteration must be an integer >= -1"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
