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

// Parameters ZeRO-3 keeps whole (outside every unit, or under
// stage3_param_persistence_threshold) follow the same rules: the modifier
// rank's values reach every rank and its fp32 master shards (a step at lr 0
// leaves them), and without a modifier every change is discarded. Before,
// they kept each rank's own change and the next step mixed the ranks'
// masters into every rank's copy.
TEST_P(GatheredParameterList, ParametersKeptWholeFollowTheModifierRankToo) {
  const Recipe r = odd_model();
  const Params initial = snapshot(*make_model(r));
  for (const int64_t persistence : {int64_t{0}, int64_t{1} << 20}) {
    run_ranks(GetParam(), [&](ProcessGroup& pg) {
      Stack model = make_model(r);
      auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                     torch::optim::SGDOptions(0.0));
      ZeroOptions options = stage3();
      options.param_persistence_threshold = persistence;  // 2^20: every unit whole
      ZeroOptimizer zero(model, *sgd, pg.shared_from_this(), options);
      const int last = GetParam() - 1;
      {
        ZeroOptimizer::GatheredParameters some(
            zero, {model->input->weight, model->blocks[0]->fc->weight}, last);
        torch::NoGradGuard no_grad;
        model->input->weight.fill_(pg.rank() == last ? 3.0 : -1.0);
        model->blocks[0]->fc->weight.fill_(pg.rank() == last ? 7.0 : -1.0);
      }
      {
        ZeroOptimizer::GatheredParameters discarded(zero, {model->output->bias});
        torch::NoGradGuard no_grad;
        model->output->bias.fill_(static_cast<double>(pg.rank()) - 5.0);
      }
      // A step at lr 0 writes the masters back into the parameters.
      sgd->zero_grad();
      auto x = torch::ones({2, r.in});
      model->forward(x).sum().backward();
      zero.step();
      Params now;
      {
        ZeroOptimizer::GatheredParameters whole(zero);
        now = snapshot(*model);
      }
      EXPECT_TRUE(torch::equal(now.at("input.weight"), torch::full({r.width, r.in}, 3.0)))
          << "persistence " << persistence << " rank " << pg.rank();
      EXPECT_TRUE(torch::equal(now.at("block0.fc.weight"), torch::full({r.width, r.width}, 7.0)))
          << "persistence " << persistence << " rank " << pg.rank();
      EXPECT_TRUE(torch::equal(now.at("output.bias"), initial.at("output.bias")))
          << "persistence " << persistence << " rank " << pg.rank();
    });
  }
}

// Guards nest, as DeepSpeed's do: an inner guard's modifier rank reaches
// every rank, and what the outer guard holds stays whole until it ends.
TEST_P(GatheredParameterList, GuardsNest) {
  const Recipe r = odd_model();
  run_ranks(GetParam(), [&](ProcessGroup& pg) {
    Stack model = make_model(r);
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    const at::Tensor bias = model->blocks[1]->fc->bias;
    {
      ZeroOptimizer::GatheredParameters outer(zero);
      {
        ZeroOptimizer::GatheredParameters inner(zero, {bias}, /*modifier_rank=*/0);
        torch::NoGradGuard no_grad;
        bias.fill_(pg.rank() == 0 ? 2.0 : -2.0);
      }
      EXPECT_TRUE(holds_memory(bias)) << "the outer guard still holds it";
      EXPECT_TRUE(torch::equal(bias, torch::full({r.width}, 2.0)));
    }
    EXPECT_FALSE(holds_memory(bias));
    ZeroOptimizer::GatheredParameters again(zero);
    EXPECT_TRUE(torch::equal(bias, torch::full({r.width}, 2.0)));
  });
}

// A frozen parameter (requires_grad false when the optimizer was built) is
// not sharded, but a guard takes it as DeepSpeed's does: the modifier rank's
// value reaches every rank, and without a modifier the change is discarded.
// Before, it was refused as "not a parameter of the model".
TEST_P(GatheredParameterList, AFrozenParameterFollowsTheModifierRankToo) {
  const Recipe r = odd_model();
  const Params initial = snapshot(*make_model(r));
  run_ranks(GetParam(), [&](ProcessGroup& pg) {
    Stack model = make_model(r);
    const at::Tensor frozen = model->blocks[1]->fc->weight;
    const at::Tensor frozen_bias = model->blocks[1]->fc->bias;
    frozen.requires_grad_(false);
    frozen_bias.requires_grad_(false);
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    const int last = GetParam() - 1;
    {
      ZeroOptimizer::GatheredParameters some(zero, {frozen, model->blocks[0]->fc->bias}, last);
      torch::NoGradGuard no_grad;
      frozen.fill_(pg.rank() == last ? 5.0 : -1.0);
    }
    EXPECT_TRUE(torch::equal(frozen, torch::full({r.width, r.width}, 5.0))) << pg.rank();
    {
      ZeroOptimizer::GatheredParameters discarded(zero, {frozen_bias});
      torch::NoGradGuard no_grad;
      frozen_bias.fill_(static_cast<double>(pg.rank()) + 9.0);
    }
    EXPECT_TRUE(torch::equal(frozen_bias, initial.at("block1.fc.bias"))) << pg.rank();
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, GatheredParameterList, ::testing::Values(2, 3));

}  // namespace
}  // namespace tandem::testing
