// ZeroOptimizer::GatheredParameters(params, modifier_rank), DeepSpeed's: only
// the units holding `params` become whole; on exit the modifier rank's
// values reach every rank's shards, and without a modifier every change is
// discarded. Worlds 2 and 3, a model of odd sizes.

#include <gtest/gtest.h>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem::testing {
namespace {

Recipe odd_model() {
  Recipe r;
  r.in = 5;
  r.width = 13;
  r.out = 3;
  r.depth = 3;
  return r;
}

class GatheredParameterList : public ::testing::TestWithParam<int> {};

TEST_P(GatheredParameterList, GathersOnlyTheirUnitsAndKeepsTheModifierRanksValues) {
  const Recipe r = odd_model();
  const Params initial = snapshot(*make_model(r));
  run_ranks(GetParam(), [&](ProcessGroup& pg) {
    Stack model = make_model(r);
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    const at::Tensor weight = model->blocks[1]->fc->weight;
    {
      ZeroOptimizer::GatheredParameters some(zero, {weight}, /*modifier_rank=*/GetParam() - 1);
      EXPECT_TRUE(holds_memory(weight));
      EXPECT_TRUE(holds_memory(model->blocks[1]->norm->weight));  // the same unit
      EXPECT_FALSE(holds_memory(model->blocks[0]->fc->weight));   // another unit
      torch::NoGradGuard no_grad;
      weight.fill_(pg.rank() == GetParam() - 1 ? 7.0 : -1.0);  // only the last rank's count
    }
    EXPECT_FALSE(holds_memory(weight));
    {
      ZeroOptimizer::GatheredParameters read_only(zero, {model->blocks[2]->fc->bias});
      torch::NoGradGuard no_grad;
      model->blocks[2]->fc->bias.fill_(3.0);  // discarded: no modifier rank
    }
    Params now;
    {
      ZeroOptimizer::GatheredParameters whole(zero);
      now = snapshot(*model);
    }
    EXPECT_TRUE(torch::equal(now.at("block1.fc.weight"), torch::full({13, 13}, 7.0)));
    EXPECT_TRUE(torch::equal(now.at("block2.fc.bias"), initial.at("block2.fc.bias")));
    EXPECT_TRUE(torch::equal(now.at("block0.fc.weight"), initial.at("block0.fc.weight")));

    EXPECT_THROW(ZeroOptimizer::GatheredParameters(zero, {torch::zeros({2})}), UsageError);
    EXPECT_THROW(ZeroOptimizer::GatheredParameters(zero, {weight}, GetParam()), UsageError);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GatheredParameterList, ::testing::Values(2, 3));

}  // namespace
}  // namespace tandem::testing
