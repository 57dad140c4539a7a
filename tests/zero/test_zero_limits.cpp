// Stage 3's limits (DeepSpeed's stage3_* keys), each measured by the bytes
// of unit parameters gathered at once: prefetch_bucket_size sets how far
// ahead units are gathered, max_live_parameters caps what is gathered at
// once, and param_persistence_threshold keeps small parameters whole. None
// of them changes what training computes.

#include <gtest/gtest.h>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/parameters.h"

namespace tandem::testing {
namespace {

// Six equal units of width 16: 16*16 + 16 (fc) + 2*16 (norm) = 304 elements,
// which 2 ranks split evenly.
Recipe six_units() {
  Recipe r;
  r.depth = 6;
  r.steps = 3;
  r.accumulation = 1;
  return r;
}
constexpr int64_t kUnitElements = 304;
constexpr int64_t kUnitBytes = kUnitElements * 4;

// The most unit-parameter bytes gathered at once during the last step (the
// first fixes the forward order prefetching follows), and the final
// parameters.
struct Trained {
  int64_t peak_gathered = 0;
  Params params;
};

Trained run(ProcessGroup& pg, const Recipe& r, const ZeroOptions& options) {
  Trained out;
  int step = 0;
  out.params = train_zero(pg, r, options, [&](ZeroOptimizer& zero, Stack&) {
    if (++step == r.steps - 1) zero.reset_stats();
    if (step == r.steps) out.peak_gathered = zero.memory_stats().peak_gathered_parameter_bytes;
  });
  return out;
}

TEST(ZeroLimits, PrefetchBucketSizeSetsHowManyUnitsAreGatheredAhead) {
  const Recipe r = six_units();
  run_ranks(2, [&](ProcessGroup& pg) {
    const Trained none = run(pg, r, stage3(/*prefetch=*/0));
    const Trained one = run(pg, r, stage3(kUnitElements));
    const Trained two = run(pg, r, stage3(2 * kUnitElements));
    const Trained all = run(pg, r, stage3(1'000'000'000));
    // The unit running, plus what the bucket holds ahead of it.
    EXPECT_EQ(none.peak_gathered, kUnitBytes);
    EXPECT_EQ(one.peak_gathered, 2 * kUnitBytes);
    EXPECT_EQ(two.peak_gathered, 3 * kUnitBytes);
    EXPECT_EQ(all.peak_gathered, r.depth * kUnitBytes);
    EXPECT_EQ(max_relative_diff(none.params, all.params), 0.0);
    EXPECT_EQ(max_relative_diff(two.params, all.params), 0.0);
  });
}

TEST(ZeroLimits, MaxLiveParametersCapsWhatIsGatheredAtOnce) {
  const Recipe r = six_units();
  run_ranks(2, [&](ProcessGroup& pg) {
    const Trained unlimited = run(pg, r, stage3(1'000'000'000));
    for (int64_t units : {1, 2, 4}) {
      const Trained capped = run(pg, r, stage3(1'000'000'000, units * kUnitElements));
      EXPECT_EQ(capped.peak_gathered, units * kUnitBytes) << units << " unit(s)";
      EXPECT_EQ(max_relative_diff(capped.params, unlimited.params), 0.0);
    }
    // Below one unit: the unit needed now is still gathered, alone.
    const Trained tiny = run(pg, r, stage3(1'000'000'000, /*max_live=*/1));
    EXPECT_EQ(tiny.peak_gathered, kUnitBytes);
  });
}

TEST(ZeroLimits, PersistenceThresholdKeepsSmallParametersWhole) {
  Recipe r = six_units();
  run_ranks(2, [&](ProcessGroup& pg) {
    const Trained partitioned = run(pg, r, stage3(0));
    // Biases and norm parameters (16 elements) stay whole; the 256-element
    // weights are still partitioned.
    Stack model = make_model(r);
    auto adam = make_optimizer(r.opt, model->parameters());
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3(0, 1'000'000'000, 100));
    for (const auto& block : model->blocks) {
      EXPECT_FALSE(holds_memory(block->fc->weight));
      EXPECT_TRUE(holds_memory(block->fc->bias));
      EXPECT_TRUE(holds_memory(block->norm->weight));
    }
    const Trained persistent = run(pg, r, stage3(0, 1'000'000'000, 100));
    EXPECT_EQ(persistent.peak_gathered, 256 * 4);
    EXPECT_LT(max_relative_diff(persistent.params, partitioned.params), 1e-6);
  });
}

TEST(ZeroLimits, ZeroInitWithOrWithoutTheThresholdGivesTheMaterialisedModel) {
  const Recipe whole = six_units();
  run_ranks(2, [&](ProcessGroup& pg) {
    const ZeroOptions options = stage3(0, 1'000'000'000, 100);
    const Trained reference = run(pg, whole, options);
    Recipe cut = whole;
    cut.zero_init = true;
    cut.zero_init_persistence = 100;  // cut as the optimizer lays out: adopted
    EXPECT_EQ(max_relative_diff(run(pg, cut, options).params, reference.params), 0.0);
    cut.zero_init_persistence = 0;  // biases cut too: each unit gathered back, then re-cut
    EXPECT_EQ(max_relative_diff(run(pg, cut, options).params, reference.params), 0.0);
  });
}

TEST(ZeroLimits, NegativeLimitsAreRefused) {
  run_ranks(1, [&](ProcessGroup& pg) {
    Stack model = make_model(six_units());
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    EXPECT_THROW(ZeroOptimizer(model, *adam, pg.shared_from_this(), stage3(-1)), UsageError);
    EXPECT_THROW(ZeroOptimizer(model, *adam, pg.shared_from_this(), stage3(0, 0)), UsageError);
    EXPECT_THROW(ZeroOptimizer(model, *adam, pg.shared_from_this(), stage3(0, 1, -5)),
                 UsageError);
  });
}

}  // namespace
}  // namespace tandem::testing
