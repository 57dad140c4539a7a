// StepController: the micro-step transitions, one at a time.

#include <gtest/gtest.h>

#include "accelerate/step_controller.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

std::vector<bool> syncs_over(StepController& c, int micro_steps) {
  std::vector<bool> out;
  for (int i = 0; i < micro_steps; ++i) {
    c.before_backward();
    c.after_backward();
    out.push_back(c.state().sync_gradients);
    if (c.state().sync_gradients) {
      c.optimizer_step(/*taken=*/true);
      c.end_step();
    } else {
      c.step_deferred();
    }
  }
  return out;
}

TEST(StepController, EveryAccumulationStepsthMicroStepSynchronises) {
  StepController c(3);
  EXPECT_EQ(syncs_over(c, 7), (std::vector<bool>{false, false, true, false, false, true, false}));
  EXPECT_EQ(c.state().optimizer_steps, 2);
  EXPECT_TRUE(c.state().gradients_pending) << "the 7th micro-step's gradients wait";
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

TEST(StepController, AGuardBeginsOneMicroStepForAnyNumberOfBackwards) {
  StepController c(2);
  const bool outer = c.enter_accumulate_guard();
  EXPECT_FALSE(outer);
  const bool nested = c.enter_accumulate_guard();
  EXPECT_TRUE(nested);
  c.before_backward();
  c.before_backward();
  EXPECT_EQ(c.state().micro_steps_since_step, 1);
  c.leave_accumulate_guard(nested);
  EXPECT_TRUE(c.state().in_accumulate_guard);
  c.leave_accumulate_guard(outer);
  EXPECT_FALSE(c.state().in_accumulate_guard);
}

TEST(StepController, ASkippedStepConsumesTheGradientsButIsNotCounted) {
  StepController c(1);
  c.before_backward();
  c.after_backward();
  c.optimizer_step(/*taken=*/false);
  EXPECT_TRUE(c.state().last_step_skipped);
  EXPECT_FALSE(c.state().gradients_pending);
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
  c.next_batch(BatchReport{});
  EXPECT_FALSE(c.state().joining);
  EXPECT_FALSE(c.state().shadow_batch);
}

TEST(StepController, RestoreStartsBetweenSteps) {
  StepController c(4);
  c.before_backward();
  c.after_backward();
  c.note_clipped();
  c.restore(17);
  EXPECT_EQ(c.state().optimizer_steps, 17);
  EXPECT_EQ(c.state().micro_step, 0);
  EXPECT_FALSE(c.state().gradients_pending);
  EXPECT_FALSE(c.state().clipped_this_step);
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
