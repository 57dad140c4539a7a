// state_dict()/load_state_dict(): a scheduler rebuilt over a fresh optimizer
// and loaded from a saved state continues exactly the saved sequence.

#include <functional>

#include <gtest/gtest.h>

#include "optim/scheduler_testing.h"
#include "tandem/core/error.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {
namespace {

using testing::group_lr;
using testing::group_options;
using testing::make_adamw;

using SchedulerMaker =
    std::function<std::unique_ptr<LRScheduler>(torch::optim::Optimizer& optimizer)>;

struct ResumeCase {
  std::string name;
  SchedulerMaker make;
};

std::vector<ResumeCase> resume_cases() {
  std::vector<ResumeCase> cases;
  cases.push_back({"WarmupLR", [](torch::optim::Optimizer& o) {
                     WarmupLROptions options;
                     options.warmup_num_steps = 10;
                     return std::make_unique<WarmupLR>(o, options);
                   }});
  cases.push_back({"WarmupDecayLR", [](torch::optim::Optimizer& o) {
                     WarmupDecayLROptions options;
                     options.total_num_steps = 20;
                     options.warmup_num_steps = 5;
                     options.warmup_type = WarmupType::kLinear;
                     return std::make_unique<WarmupDecayLR>(o, options);
                   }});
  cases.push_back({"WarmupCosineLR", [](torch::optim::Optimizer& o) {
                     WarmupCosineLROptions options;
                     options.total_num_steps = 20;
                     options.warmup_num_steps = 5;
                     options.warmup_min_ratio = 0.1;
                     return std::make_unique<WarmupCosineLR>(o, options);
                   }});
  cases.push_back({"OneCycle", [](torch::optim::Optimizer& o) {
                     OneCycleOptions options;
                     options.cycle_min_lr = 0.01;
                     options.cycle_max_lr = 0.1;
                     options.cycle_first_step_size = 4;
                     options.cycle_second_step_size = 6;
                     options.decay_step_size = 3;
                     options.decay_lr_rate = 0.2;
                     options.decay_mom_rate = 0.01;
                     return std::make_unique<OneCycle>(o, options);
                   }});
  return cases;
}

double group_beta1(const torch::optim::Optimizer& optimizer, size_t group) {
  return std::get<0>(group_options<torch::optim::AdamWOptions>(optimizer, group).betas());
}

TEST(SchedulerState, FreshSchedulerSavesMinusOne) {
  auto optimizer = make_adamw();
  WarmupLR scheduler(*optimizer);
  // Without warmup_max_lr the peak is the group's lr, which travels along.
  EXPECT_EQ(scheduler.state_dict(),
            (std::map<std::string, double>{{"last_batch_iteration", -1.0},
                                           {"type.WarmupLR", 1.0},
                                           {"warmup_max_lr.0", 1e-3}}));
  scheduler.step();
  scheduler.step();
  EXPECT_EQ(scheduler.state_dict().at("last_batch_iteration"), 1.0);
}

TEST(SchedulerState, CosineStateCarriesEachGroupsInitialLr) {
  auto optimizer = make_adamw({0.1, 0.02});
  WarmupCosineLROptions options;
  options.total_num_steps = 10;
  WarmupCosineLR scheduler(*optimizer, options);
  EXPECT_EQ(scheduler.state_dict(), (std::map<std::string, double>{{"last_batch_iteration", -1.0},
                                                                   {"type.WarmupCosineLR", 1.0},
                                                                   {"initial_lr.0", 0.1},
                                                                   {"initial_lr.1", 0.02}}));
}

TEST(SchedulerState, RoundTripResumesTheSameLrAndMomentumSequence) {
  for (const auto& c : resume_cases()) {
    SCOPED_TRACE(c.name);
    auto original_optimizer = make_adamw({0.1, 0.05});
    auto original = c.make(*original_optimizer);
    for (int i = 0; i < 7; ++i) original->step();
    auto saved = original->state_dict();

    // The resumed run builds everything afresh, as a restarted program does.
    auto resumed_optimizer = make_adamw({0.1, 0.05});
    auto resumed = c.make(*resumed_optimizer);
    resumed->load_state_dict(saved);
    EXPECT_EQ(resumed->last_batch_iteration(), 6);
    EXPECT_EQ(resumed->get_last_lr(), original->get_last_lr());
    for (size_t g = 0; g < 2; ++g) {
      EXPECT_EQ(group_lr(*resumed_optimizer, g), group_lr(*original_optimizer, g));
      EXPECT_EQ(group_beta1(*resumed_optimizer, g), group_beta1(*original_optimizer, g));
    }
    for (int i = 0; i < 20; ++i) {
      original->step();
      resumed->step();
      ASSERT_EQ(resumed->last_batch_iteration(), original->last_batch_iteration());
      for (size_t g = 0; g < 2; ++g) {
        EXPECT_EQ(group_lr(*resumed_optimizer, g), group_lr(*original_optimizer, g))
            << "step " << original->last_batch_iteration() << " group " << g;
        EXPECT_EQ(group_beta1(*resumed_optimizer, g), group_beta1(*original_optimizer, g))
            << "step " << original->last_batch_iteration() << " group " << g;
      }
    }
  }
}

TEST(SchedulerState, CosineResumeUsesTheSavedInitialLrNotTheOptimizersCurrentLr) {
  WarmupCosineLROptions options;
  options.total_num_steps = 20;
  options.warmup_num_steps = 4;
  auto optimizer = make_adamw({0.1});
  WarmupCosineLR original(*optimizer, options);
  for (int i = 0; i < 9; ++i) original.step();
  // A restored optimizer already carries the scheduled (decayed) lr.
  auto restored_optimizer = make_adamw({group_lr(*optimizer, 0)});
  WarmupCosineLR resumed(*restored_optimizer, options);
  resumed.load_state_dict(original.state_dict());
  EXPECT_EQ(resumed.initial_lrs(), std::vector<double>{0.1});
  original.step();
  resumed.step();
  EXPECT_EQ(group_lr(*restored_optimizer, 0), group_lr(*optimizer, 0));
}

TEST(SchedulerState, LoadRejectsMismatchedStateAndChangesNothing) {
  auto optimizer = make_adamw({0.1, 0.05});
  WarmupCosineLROptions options;
  options.total_num_steps = 10;
  options.warmup_num_steps = 2;
  WarmupCosineLR scheduler(*optimizer, options);
  scheduler.step();
  scheduler.step();
  const double lr_before = group_lr(*optimizer, 0);

  auto expect_rejected = [&](const std::map<std::string, double>& state,
                             const std::string& fragment) {
    try {
      scheduler.load_state_dict(state);
      ADD_FAILURE() << "accepted a bad state (" << fragment << ")";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(scheduler.last_batch_iteration(), 1);
    EXPECT_EQ(scheduler.initial_lrs(), (std::vector<double>{0.1, 0.05}));
    EXPECT_EQ(group_lr(*optimizer, 0), lr_before);
  };
  // A WarmupLR state, or a state saved over one param group.
  expect_rejected({{"last_batch_iteration", 3}}, "missing keys: 'initial_lr.0', 'initial_lr.1'");
  expect_rejected({{"last_batch_iteration", 3}, {"initial_lr.0", 0.1}},
                  "missing keys: 'initial_lr.1'");
  expect_rejected(
      {{"last_batch_iteration", 3}, {"initial_lr.0", 0.1}, {"initial_lr.1", 0.1}, {"epoch", 2}},
      "unknown keys: 'epoch'");
  expect_rejected({{"last_batch_iteration", 2.5}, {"initial_lr.0", 0.1}, {"initial_lr.1", 0.1}},
                  "must be an integer >= -1");
  expect_rejected({{"last_batch_iteration", -2}, {"initial_lr.0", 0.1}, {"initial_lr.1", 0.1}},
                  "must be an integer >= -1");
  expect_rejected({{"last_batch_iteration", 3}, {"initial_lr.0", 0.1}, {"initial_lr.1", -1}},
                  "'initial_lr.1' must be a finite lr >= 0");
}

TEST(SchedulerState, LoadingMinusOneRestoresTheConstructionValues) {
  auto optimizer = make_adamw({0.5});
  WarmupLROptions options;
  options.warmup_min_lr = 0.01;
  options.warmup_max_lr = 0.1;
  WarmupLR scheduler(*optimizer, options);
  for (int i = 0; i < 5; ++i) scheduler.step();
  scheduler.load_state_dict({{"last_batch_iteration", -1}});
  EXPECT_EQ(scheduler.last_batch_iteration(), -1);
  EXPECT_EQ(group_lr(*optimizer, 0), 0.01);
}

// A state knows the kind of scheduler that saved it: another kind would
// take only its counter and go on along another curve, in silence.
TEST(SchedulerState, AStateOfAnotherKindIsRefusedNamingItAndChangesNothing) {
  const std::vector<ResumeCase> cases = resume_cases();
  for (const auto& saver : cases) {
    auto saving_optimizer = make_adamw({0.1, 0.05});
    auto saving = saver.make(*saving_optimizer);
    for (int i = 0; i < 3; ++i) saving->step();
    const auto saved = saving->state_dict();
    for (const auto& loader : cases) {
      if (loader.name == saver.name) continue;
      SCOPED_TRACE(saver.name + " into " + loader.name);
      auto optimizer = make_adamw({0.1, 0.05});
      auto scheduler = loader.make(*optimizer);
      scheduler->step();
      const double lr_before = group_lr(*optimizer, 0);
      try {
        scheduler->load_state_dict(saved);
        ADD_FAILURE() << "loaded another kind's state";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("saved by a " + saver.name + " scheduler"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_EQ(scheduler->last_batch_iteration(), 0);
      EXPECT_EQ(group_lr(*optimizer, 0), lr_before);
    }
  }
}

// States saved before the kind was recorded hold only the counter (and
// WarmupCosineLR's initial lrs); they still load.
TEST(SchedulerState, AStateWithoutItsKindStillLoads) {
  auto optimizer = make_adamw({0.1});
  WarmupLROptions options;
  options.warmup_num_steps = 10;
  WarmupLR scheduler(*optimizer, options);
  scheduler.load_state_dict({{"last_batch_iteration", 4}});
  EXPECT_EQ(scheduler.last_batch_iteration(), 4);
  auto reference_optimizer = make_adamw({0.1});
  WarmupLR reference(*reference_optimizer, options);
  for (int i = 0; i < 5; ++i) reference.step();
  EXPECT_EQ(scheduler.get_last_lr(), reference.get_last_lr());
}

// WarmupLR without warmup_max_lr peaks at each group's lr as built. A plain
// loop that restores its optimizer before building the scheduler builds it
// over the scheduled (lower) lr; the saved peaks keep the curve.
TEST(SchedulerState, WarmupLrResumeUsesTheSavedPeaksNotTheOptimizersCurrentLr) {
  WarmupLROptions options;
  options.warmup_num_steps = 20;
  options.warmup_type = WarmupType::kLinear;
  auto optimizer = make_adamw({1e-3, 3e-3});
  WarmupLR original(*optimizer, options);
  for (int i = 0; i < 7; ++i) original.step();
  auto restored_optimizer = make_adamw({group_lr(*optimizer, 0), group_lr(*optimizer, 1)});
  WarmupLR resumed(*restored_optimizer, options);
  resumed.load_state_dict(original.state_dict());
  for (int i = 0; i < 30; ++i) {
    original.step();
    resumed.step();
    for (size_t g = 0; g < 2; ++g) {
      ASSERT_EQ(group_lr(*restored_optimizer, g), group_lr(*optimizer, g))
          << "step " << original.last_batch_iteration() << " group " << g;
    }
  }
  // Peaks given in the options are the config's, and win over saved ones.
  options.warmup_max_lr = 0.5;
  auto configured_optimizer = make_adamw({1e-3, 3e-3});
  WarmupLR configured(*configured_optimizer, options);
  configured.load_state_dict(original.state_dict());
  EXPECT_EQ(configured.state_dict().count("warmup_max_lr.0"), 0u);
  EXPECT_EQ(group_lr(*configured_optimizer, 1), 0.5);  // past the warmup: the peak
}

}  // namespace
}  // namespace tandem
