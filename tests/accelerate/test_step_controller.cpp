// StepController: the micro-step transitions, one at a time.

#include <gtest/gtest.h>

#include "accelerate/step_controller.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

// Micro-steps of a one-optimizer loop (optimizer id 0, added on first use).
std::vector<bool> syncs_over(StepController& c, int micro_steps) {
  if (c.num_optimizers() == 0) c.add_optimizer();
  std::vector<bool> out;
  for (int i = 0; i < micro_steps; ++i) {
    c.before_backward();
    c.after_backward();
    out.push_back(c.state().sync_gradients);
    if (c.state().sync_gradients) {
      c.optimizer_step(0, /*taken=*/true);
      c.end_step(0);
    } else {
      c.step_deferred(0);
    }
  }
  return out;
}

TEST(StepController, EveryAccumulationStepsthMicroStepSynchronises) {
  StepController c(3);
  EXPECT_EQ(syncs_over(c, 7), (std::vector<bool>{false, false, true, false, false, true, false}));
  EXPECT_EQ(c.state().optimizer_steps, 2);
  EXPECT_TRUE(c.gradients_pending()) << "the 7th micro-step's gradients wait";
}

TEST(StepController, TheLastBatchOfAPassSynchronisesAndRestartsTheCycle) {
  StepController c(3);
  BatchReport last;
  last.last_of_pass = true;
  c.next_batch(BatchReport{});
  EXPECT_EQ(syncs_over(c, 1), (std::vector<bool>{false}));
  c.next_batch(last);
  EXPECT_EQ(syncs_over(c, 1), (std::vector<bool>{true})) << "a short cycle ends with the pass";
  c.end_of_pass();
  EXPECT_FALSE(c.state().end_of_dataloader);
  EXPECT_EQ(syncs_over(c, 3), (std::vector<bool>{false, false, true}));
}

// Accelerate's GradientAccumulationPlugin(sync_with_dataloader=False): a
// pass's last batch no longer cuts the cycle short; micro-batches are
// counted across passes.
TEST(StepController, WithoutSyncWithDataloaderTheCycleRunsIntoTheNextPass) {
  StepController c(3);
  c.set_sync_rules(/*with_dataloader=*/false, /*each_batch=*/false);
  BatchReport last;
  last.last_of_pass = true;
  std::vector<bool> syncs;
  for (int pass = 0; pass < 2; ++pass) {
    for (int b = 0; b < 4; ++b) {
      c.next_batch(b == 3 ? last : BatchReport{});
      syncs.push_back(syncs_over(c, 1)[0]);
    }
    c.end_of_pass();
  }
  EXPECT_EQ(syncs, (std::vector<bool>{false, false, true, false, false, true, false, false}));
}

// sync_each_batch: the model reduces in every backward, the optimizer keeps
// its cycle.
TEST(StepController, SyncEachBatchReducesEveryMicroStepButStepsOncePerCycle) {
  for (bool each_batch : {false, true}) {
    StepController c(3);
    c.set_sync_rules(/*with_dataloader=*/true, each_batch);
    std::vector<bool> reduced;
    c.attach_gradient_sync([&](bool enabled) { reduced.push_back(enabled); });
    EXPECT_EQ(syncs_over(c, 4), (std::vector<bool>{false, false, true, false}));
    const std::vector<bool> expected =
        each_batch ? std::vector<bool>{true, true, true, true}
                   : std::vector<bool>{false, false, true, false};
    EXPECT_EQ(reduced, expected);
  }
}

TEST(StepController, AGuardBeginsOneMicroStepForAnyNumberOfBackwards) {
  StepController c(2);
  const bool outer = c.enter_accumulate_guard();
  EXPECT_FALSE(outer);
  const bool nested = c.enter_accumulate_guard();
  EXPECT_TRUE(nested);
  c.before_backward();
  c.before_backward();
  EXPECT_EQ(c.micro_steps_begun(), 1);
  c.leave_accumulate_guard(nested);
  EXPECT_TRUE(c.state().in_accumulate_guard);
  c.leave_accumulate_guard(outer);
  EXPECT_FALSE(c.state().in_accumulate_guard);
}

TEST(StepController, ASkippedStepConsumesTheGradientsButIsNotCounted) {
  StepController c(1);
  const int opt = c.add_optimizer();
  c.before_backward();
  c.after_backward();
  c.optimizer_step(opt, /*taken=*/false);
  EXPECT_TRUE(c.optimizer(opt).last_step_skipped());
  EXPECT_FALSE(c.gradients_pending());
  EXPECT_EQ(c.state().optimizer_steps, 0);
}

TEST(StepController, AJoinedBatchCountsTheRanksWithData) {
  StepController c(1);
  BatchReport joined;
  joined.rows = 4;
  joined.shadow_ranks = {0, 1, 0};
  joined.rank = 1;
  c.next_batch(joined);
  EXPECT_TRUE(c.state().joining);
  EXPECT_TRUE(c.state().shadow_batch);
  EXPECT_EQ(c.state().ranks_with_data, 2);
  EXPECT_EQ(c.batch().shadow_ranks, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(c.batch().rows, 4);
  c.next_batch(BatchReport{});
  EXPECT_FALSE(c.state().joining);
  EXPECT_FALSE(c.state().shadow_batch);
  EXPECT_TRUE(c.batch().shadow_ranks.empty());
  c.end_of_pass();
  EXPECT_EQ(c.batch().rows, 0);
}

TEST(StepController, EachOptimizerKnowsWhetherItsOwnStepWasSkipped) {
  // Two optimizers, one micro-step: the first steps, the second overflows.
  // "The last step was skipped" is per optimizer, whichever went last.
  StepController c(1);
  const int a = c.add_optimizer();
  const int b = c.add_optimizer();
  c.before_backward();
  c.after_backward();
  c.optimizer_step(a, /*taken=*/true);
  c.end_step(a);
  c.optimizer_step(b, /*taken=*/false);
  c.end_step(b);
  EXPECT_FALSE(c.optimizer(a).last_step_skipped());
  EXPECT_TRUE(c.optimizer(b).last_step_skipped());
  c.before_backward();
  c.after_backward();
  c.optimizer_step(b, /*taken=*/true);
  c.end_step(b);
  c.optimizer_step(a, /*taken=*/false);
  c.end_step(a);
  EXPECT_TRUE(c.optimizer(a).last_step_skipped());
  EXPECT_FALSE(c.optimizer(b).last_step_skipped());
  EXPECT_EQ(c.state().optimizer_steps, 1);
}

TEST(StepController, RestoreStartsBetweenSteps) {
  StepController c(4);
  const int a = c.add_optimizer();
  const int b = c.add_optimizer();
  c.before_backward();
  c.after_backward();
  c.note_clipped(a);
  c.step_deferred(b);
  c.restore(17, {17, 9});
  EXPECT_EQ(c.state().optimizer_steps, 17);
  EXPECT_EQ(c.optimizer(a).steps, 17);
  EXPECT_EQ(c.optimizer(b).steps, 9);
  EXPECT_FALSE(c.optimizer(a).clipped);
  EXPECT_FALSE(c.optimizer(b).deferred);
  EXPECT_EQ(c.state().micro_step, 0);
  EXPECT_FALSE(c.gradients_pending());
}

TEST(StepController, ZeroGradZeroesOncePerCycleAtTheTopOrTheBottomOfTheLoop) {
  // Top of the loop: zero, backward, step.
  StepController top(2);
  const int t = top.add_optimizer();
  std::vector<bool> zeroed;
  for (int i = 0; i < 4; ++i) {
    zeroed.push_back(top.zero_grad(t));
    top.before_backward();
    top.after_backward();
    if (top.state().sync_gradients) {
      top.optimizer_step(t, true);
      top.end_step(t);
    } else {
      top.step_deferred(t);
    }
  }
  EXPECT_EQ(zeroed, (std::vector<bool>{true, false, true, false}));
  // Bottom of the loop: backward, step, zero.
  StepController bottom(2);
  const int o = bottom.add_optimizer();
  zeroed.clear();
  for (int i = 0; i < 4; ++i) {
    bottom.before_backward();
    bottom.after_backward();
    if (bottom.state().sync_gradients) {
      bottom.optimizer_step(o, true);
      bottom.end_step(o);
    } else {
      bottom.step_deferred(o);
    }
    zeroed.push_back(bottom.zero_grad(o));
  }
  EXPECT_EQ(zeroed, (std::vector<bool>{false, true, false, true}))
      << "a deferred step's partial sums are kept";
}

// A GAN without accumulation: the generator's backward writes into the
// discriminator after the discriminator stepped and zeroed; its second
// zero_grad() clears that, as torch's does (it used to keep it for the next
// discriminator step).
TEST(StepController, ZeroGradAfterAnotherSynchronisingBackwardZeroesAgain) {
  StepController c(1);
  const int d = c.add_optimizer();
  const int g = c.add_optimizer();
  c.before_backward();  // discriminator loss
  c.after_backward();
  c.optimizer_step(d, true);
  c.end_step(d);
  EXPECT_TRUE(c.zero_grad(d));
  EXPECT_FALSE(c.zero_grad(d)) << "nothing arrived since";
  c.before_backward();  // generator loss, through the discriminator
  c.after_backward();
  c.optimizer_step(g, true);
  c.end_step(g);
  EXPECT_TRUE(c.zero_grad(g));
  EXPECT_TRUE(c.zero_grad(d)) << "the generator's backward reached the discriminator";
}

TEST(StepController, EachOptimizerKeepsItsOwnCycle) {
  // A GAN iteration under one accumulate() guard: the discriminator zeroes,
  // backs up and steps, then the generator zeroes (its stale gradients from
  // the last cycle must go although a backward already ran this micro-step).
  StepController c(1);
  const int d = c.add_optimizer();
  const int g = c.add_optimizer();
  for (int i = 0; i < 3; ++i) {
    const bool outer = c.enter_accumulate_guard();
    EXPECT_TRUE(c.zero_grad(d));
    c.before_backward();
    c.after_backward();
    c.optimizer_step(d, true);
    c.end_step(d);
    EXPECT_TRUE(c.zero_grad(g));
    c.before_backward();
    c.after_backward();
    EXPECT_EQ(c.micro_steps_since_step(g), 1) << "g has not stepped in this micro-step";
    c.optimizer_step(g, true);
    c.end_step(g);
    c.leave_accumulate_guard(outer);
  }
  EXPECT_EQ(c.optimizer(d).steps, 3);
  EXPECT_EQ(c.optimizer(g).steps, 3);
  EXPECT_EQ(c.state().optimizer_steps, 3) << "step() counts iterations, not optimizers";
  EXPECT_FALSE(c.gradients_pending());
}

TEST(StepController, OneJoinGuardAtATime) {
  StepController c(1);
  c.begin_join();
  EXPECT_THROW(c.begin_join(), UsageError);
  c.end_join();
  EXPECT_NO_THROW(c.begin_join());
}

TEST(StepController, RefusesAccumulationBelowOne) {
  EXPECT_THROW(StepController(0), UsageError);
}

}  // namespace
}  // namespace tandem::detail
