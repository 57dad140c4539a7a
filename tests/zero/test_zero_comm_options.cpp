// DeepSpeed's communication knobs on ZeroOptions (the config's
// zero_optimization.reduce_scatter, overlap_comm and allgather_bucket_size):
// each changes how gradients and parameters travel, never the result, so
// every case trains like DDP and shows its effect in comm_stats().

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::Params;
using testing::Recipe;
using testing::run_ranks;

struct CommOptionsRun {
  std::vector<Params> params;                       // per rank, after training
  std::vector<ZeroOptimizer::CommStats> stats;      // per rank, after the last step
  std::vector<std::size_t> groups;                  // per rank
};

Recipe comm_options_recipe() {
  Recipe r;
  r.global_batch = 12;  // splits evenly over 2 and 3 ranks
  r.steps = 3;
  return r;
}

Params comm_ddp_reference(int world, const Recipe& r) {
  std::vector<Params> out(world);
  run_ranks(world, [&](ProcessGroup& pg) { out[pg.rank()] = testing::train_ddp(pg, r); });
  return out[0];
}

CommOptionsRun comm_zero_run(int world, const Recipe& r, const ZeroOptions& options) {
  CommOptionsRun run;
  run.params.resize(world);
  run.stats.resize(world);
  run.groups.resize(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    run.params[rank] = testing::train_zero(pg, r, options, [&](ZeroOptimizer& zero, auto&) {
      run.stats[rank] = zero.comm_stats();
      run.groups[rank] = zero.group_parameter_names().size();
    });
  });
  return run;
}

void comm_expect_like_ddp(const CommOptionsRun& run, const Params& expected) {
  for (std::size_t rank = 0; rank < run.params.size(); ++rank) {
    EXPECT_LT(testing::max_relative_diff(run.params[rank], expected), 1e-5) << "rank " << rank;
  }
}

ZeroOptions comm_options_for(int stage) {
  ZeroOptions options;
  options.stage = stage;
  options.reduce_bucket_size = 150;  // several buckets in stages 1 and 2
  if (stage == 3) options.prefetch_bucket_size = 0;
  return options;
}

using CommStageWorld = std::tuple<int, int>;
std::string comm_case_name(const ::testing::TestParamInfo<CommStageWorld>& info) {
  return "Stage" + std::to_string(std::get<0>(info.param)) + "World" +
         std::to_string(std::get<1>(info.param));
}

class ZeroReduceScatterOff : public ::testing::TestWithParam<CommStageWorld> {};

TEST_P(ZeroReduceScatterOff, AllReducesEveryPackAndTrainsLikeDdp) {
  auto [stage, world] = GetParam();
  const Recipe r = comm_options_recipe();
  ZeroOptions options = comm_options_for(stage);
  const CommOptionsRun on = comm_zero_run(world, r, options);
  options.reduce_scatter = false;
  const CommOptionsRun off = comm_zero_run(world, r, options);
  const Params expected = comm_ddp_reference(world, r);
  comm_expect_like_ddp(on, expected);
  comm_expect_like_ddp(off, expected);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_GT(on.stats[rank].reduce_scatters, 0);
    EXPECT_EQ(on.stats[rank].gradient_all_reduces, 0);
    EXPECT_EQ(off.stats[rank].reduce_scatters, 0);
    // One all-reduce per group per micro-step: the same count the
    // reduce-scatters had.
    EXPECT_EQ(off.stats[rank].gradient_all_reduces, on.stats[rank].reduce_scatters);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroReduceScatterOff,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(2, 3)),
                         comm_case_name);

class ZeroOverlapCommOff : public ::testing::TestWithParam<CommStageWorld> {};

TEST_P(ZeroOverlapCommOff, ReducesNothingDuringBackwardAndTrainsLikeDdp) {
  auto [stage, world] = GetParam();
  const Recipe r = comm_options_recipe();
  ZeroOptions options = comm_options_for(stage);
  const CommOptionsRun overlapped = comm_zero_run(world, r, options);
  options.overlap_comm = false;
  const CommOptionsRun after = comm_zero_run(world, r, options);
  const Params expected = comm_ddp_reference(world, r);
  comm_expect_like_ddp(overlapped, expected);
  comm_expect_like_ddp(after, expected);
  for (int rank = 0; rank < world; ++rank) {
    // Overlapped: every group but the last to complete goes out while
    // backward still runs.
    EXPECT_GT(overlapped.stats[rank].reductions_launched_in_backward, 0) << "rank " << rank;
    EXPECT_EQ(after.stats[rank].reductions_launched_in_backward, 0) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroOverlapCommOff,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 3)),
                         comm_case_name);

class ZeroAllgatherBucket : public ::testing::TestWithParam<CommStageWorld> {};

TEST_P(ZeroAllgatherBucket, SplitsEachGatherIntoBucketsAndTrainsLikeDdp) {
  auto [stage, world] = GetParam();
  const Recipe r = comm_options_recipe();
  ZeroOptions options = comm_options_for(stage);
  const CommOptionsRun whole = comm_zero_run(world, r, options);
  options.allgather_bucket_size = 5;  // below the world size too: one element per rank
  const CommOptionsRun split = comm_zero_run(world, r, options);
  const Params expected = comm_ddp_reference(world, r);
  comm_expect_like_ddp(whole, expected);
  comm_expect_like_ddp(split, expected);
  for (int rank = 0; rank < world; ++rank) {
    if (stage < 3) {
      // One all-gather per group per step.
      EXPECT_EQ(whole.stats[rank].parameter_all_gather_calls,
                static_cast<int64_t>(whole.groups[rank]) * r.steps);
    } else {
      EXPECT_GT(whole.stats[rank].parameter_all_gather_calls, 0);
    }
    // Each rank's shard of a group goes in pieces of max(1, 5 / world)
    // elements.
    EXPECT_GT(split.stats[rank].parameter_all_gather_calls,
              whole.stats[rank].parameter_all_gather_calls);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroAllgatherBucket,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 3)),
                         comm_case_name);

TEST(ZeroAllgatherBucket, RefusesABucketBelowOneElement) {
  run_ranks(1, [&](ProcessGroup& pg) {
    ZeroOptions options = comm_options_for(2);
    options.allgather_bucket_size = 0;
    EXPECT_THROW(testing::train_zero(pg, comm_options_recipe(), options), UsageError);
  });
}

}  // namespace
}  // namespace tandem
