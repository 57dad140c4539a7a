// ZeRO stages 1-3 with the optimizers beyond Adam, AdamW and SGD train
// exactly like DDP with the same optimizer stepping whole parameters (fp32,
// within 1e-5 relative), at worlds 2 and 3: torch::optim's Adagrad and
// RMSprop (centered, with momentum), Adagrad over groups that set their own
// initial_accumulator_value, tandem's Lion and Lamb (whose
// per-parameter trust ratio spans the shards), and Adam with amsgrad built
// over the shards by a shard_optimizer_factory. Also: Lion's and Lamb's
// math on closed forms, and what ZeRO refuses.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>

#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "support/zero_test_models.h"
#include "tandem/core/torch_types.h"
#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"
#include "tandem/optim/optimizer_factory.h"

namespace tandem {
namespace {

using testing::Opt;
using testing::Params;
using testing::Recipe;
using testing::run_ranks;

const char* optimizer_label(Opt opt) {
  switch (opt) {
    case Opt::kAdagrad: return "Adagrad";
    case Opt::kRmsprop: return "Rmsprop";
    case Opt::kLion: return "Lion";
    case Opt::kLamb: return "Lamb";
    case Opt::kAmsgrad: return "AmsgradByFactory";
    case Opt::kAdagradGroups: return "AdagradGroups";
    case Opt::kSgdNesterov: return "SgdNesterov";
    case Opt::kSgdDampening: return "SgdDampening";
    default: return "Other";
  }
}

void expect_refusal_naming(const std::function<void()>& fn, const std::string& needle) {
  const std::string message = testing::usage_error_message(fn);
  EXPECT_NE(message.find(needle), std::string::npos) << "message: " << message;
}

using OptimizerCase = std::tuple<int /*stage*/, int /*world*/, Opt, bool /*offload*/>;

class ZeroOptimizers : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(ZeroOptimizers, TrainLikeDdpWithTheSameOptimizer) {
  auto [stage, world, opt, offload] = GetParam();
  Recipe r;
  r.opt = opt;
  r.width = 15;  // odd sizes: shards cut parameters mid-row
  ZeroOptions options;
  options.stage = stage;
  options.reduce_bucket_size = 150;
  options.offload_optimizer = offload;
  const Params expected = testing::ddp_reference(world, r);
  const std::vector<Params> got = testing::zero_runs(world, r, options);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_LT(testing::max_relative_diff(got[rank], expected), 1e-5) << "rank " << rank;
  }
  testing::Stack initial = testing::make_model(r);
  EXPECT_GT(testing::max_relative_diff(testing::snapshot(*initial), expected), 1e-3)
      << "training did not move the parameters";
}

INSTANTIATE_TEST_SUITE_P(
    StagesWorlds, ZeroOptimizers,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 3),
                       ::testing::Values(Opt::kAdagrad, Opt::kRmsprop, Opt::kLion, Opt::kLamb,
                                         Opt::kAmsgrad, Opt::kAdagradGroups, Opt::kSgdNesterov,
                                         Opt::kSgdDampening),
                       ::testing::Values(false)),
    [](const ::testing::TestParamInfo<OptimizerCase>& info) {
      return "Stage" + std::to_string(std::get<0>(info.param)) + "World" +
             std::to_string(std::get<1>(info.param)) + optimizer_label(std::get<2>(info.param));
    });

INSTANTIATE_TEST_SUITE_P(
    Offload, ZeroOptimizers,
    ::testing::Combine(::testing::Values(2, 3), ::testing::Values(2),
                       ::testing::Values(Opt::kRmsprop, Opt::kLamb), ::testing::Values(true)),
    [](const ::testing::TestParamInfo<OptimizerCase>& info) {
      return "Stage" + std::to_string(std::get<0>(info.param)) + "World" +
             std::to_string(std::get<1>(info.param)) + optimizer_label(std::get<2>(info.param)) +
             "Offload";
    });

// A config's SGD nesterov and dampening reach the optimizer it builds
// (they used to be warned about and dropped).
TEST(ConfigOptimizers, SgdNesterovAndDampeningReachTheOptimizer) {
  torch::nn::Linear layer(3, 2);
  OptimizerConfig config;
  config.type = "SGD";
  config.momentum = 0.9;
  config.dampening = 0.25;
  config.nesterov = false;
  auto damped = make_optimizer(config, layer->parameters(), 0.1);
  const auto& d = static_cast<const torch::optim::SGDOptions&>(damped->defaults());
  EXPECT_EQ(d.dampening(), 0.25);
  EXPECT_FALSE(d.nesterov());
  config.dampening.reset();
  config.nesterov = true;
  auto nesterov = make_optimizer(config, layer->parameters(), 0.1);
  EXPECT_TRUE(static_cast<const torch::optim::SGDOptions&>(nesterov->defaults()).nesterov());
}

// Lamb's trust ratio is what makes it differ from Adam-like updates: the
// parity above means something only if the ratio is not 1 everywhere.
TEST(ZeroOptimizers, LambTrustRatioChangesTheResult) {
  Recipe lamb;
  lamb.opt = Opt::kLamb;
  Params with_ratio = testing::ddp_reference(2, lamb);
  // max_coeff = min_coeff = 1 turns the ratio off.
  testing::Stack model = testing::make_model(lamb);
  Lamb plain(model->parameters(), LambOptions(1e-2).weight_decay(0.01).max_coeff(1).min_coeff(1));
  for (int step = 0; step < lamb.steps; ++step) {
    plain.zero_grad();
    for (int micro = 0; micro < lamb.accumulation; ++micro) {
      auto [x, y] = testing::micro_batch(lamb, step, micro, 0, 1);
      (torch::nn::functional::cross_entropy(model->forward(x), y) / lamb.accumulation).backward();
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), lamb.clip);
    plain.step();
  }
  const Params without = testing::snapshot(*model);
  EXPECT_GT(testing::max_relative_diff(with_ratio, without), 1e-3);
}

// torch::save / torch::load of tandem's optimizers keep their state and
// options, as torch::optim's do: a run saved after 3 steps and loaded into
// a fresh optimizer continues exactly as the run that never stopped.
template <typename Opt, typename Options>
void expect_save_load_continues_exactly(const Options& options) {
  torch::manual_seed(3);
  const at::Tensor init = torch::randn({5, 7}, torch::kDouble);
  const at::Tensor target = torch::randn({5, 7}, torch::kDouble);
  auto train = [&](at::Tensor& p, Opt& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      ((p - target * (s + 1)).pow(2).sum()).backward();
      opt.step();
    }
  };
  at::Tensor straight = init.clone().requires_grad_(true);
  Opt straight_opt(std::vector<at::Tensor>{straight}, options);
  train(straight, straight_opt, 5);

  at::Tensor resumed = init.clone().requires_grad_(true);
  std::stringstream saved;
  {
    Opt first(std::vector<at::Tensor>{resumed}, options);
    train(resumed, first, 3);
    torch::save(first, saved);
  }
  Opt second(std::vector<at::Tensor>{resumed}, Options(123.0));  // options come from the file
  torch::load(second, saved);
  EXPECT_EQ(second.state().size(), 1u) << "the state did not come back";
  EXPECT_EQ(second.param_groups()[0].options().get_lr(), options.lr());
  // Continue with the same step numbers as the straight run (targets 4, 5).
  for (int s = 3; s < 5; ++s) {
    second.zero_grad();
    ((resumed - target * (s + 1)).pow(2).sum()).backward();
    second.step();
  }
  EXPECT_TRUE(torch::equal(resumed, straight))
      << "max diff " << (resumed - straight).abs().max().item<double>();
}

TEST(OptimizerSerialization, LionAndLambSurviveTorchSaveAndLoad) {
  expect_save_load_continues_exactly<Lion>(LionOptions(1e-2).betas({0.8, 0.95}).weight_decay(0.1));
  expect_save_load_continues_exactly<Lamb>(
      LambOptions(1e-2).betas({0.8, 0.95}).weight_decay(0.1).max_coeff(3).min_coeff(0.05));
}

TEST(LionMath, OneStepMatchesTheClosedForm) {
  // p = [1, -2, 3], g = [0.5, 0, -1], m = [0.1, -0.2, 0]: c = 0.9 m + 0.1 g
  // = [0.14, -0.18, -0.1], so p <- p (1 - lr wd) - lr sign(c).
  at::Tensor p = torch::tensor({1.0, -2.0, 3.0}, torch::kDouble);
  p.mutable_grad() = torch::tensor({0.5, 0.0, -1.0}, torch::kDouble);
  Lion lion(std::vector<at::Tensor>{p}, LionOptions(0.1).betas({0.9, 0.99}).weight_decay(0.5));
  auto state = std::make_unique<LionParamState>();
  state->exp_avg(torch::tensor({0.1, -0.2, 0.0}, torch::kDouble));
  lion.state()[compat::optimizer_state_key(p)] = std::move(state);
  lion.step();
  const double decay = 1 - 0.1 * 0.5;
  EXPECT_NEAR(p[0].item<double>(), 1.0 * decay - 0.1, 1e-12);
  EXPECT_NEAR(p[1].item<double>(), -2.0 * decay + 0.1, 1e-12);
  EXPECT_NEAR(p[2].item<double>(), 3.0 * decay + 0.1, 1e-12);
  auto& m = static_cast<LionParamState&>(*lion.state()[compat::optimizer_state_key(p)]).exp_avg();
  EXPECT_NEAR(m[0].item<double>(), 0.99 * 0.1 + 0.01 * 0.5, 1e-12);
  EXPECT_NEAR(m[1].item<double>(), 0.99 * -0.2, 1e-12);
  EXPECT_NEAR(m[2].item<double>(), 0.01 * -1.0, 1e-12);
}

TEST(LionMath, AZeroDirectionLeavesTheElement) {
  at::Tensor p = torch::tensor({2.0}, torch::kDouble);
  p.mutable_grad() = torch::zeros({1}, torch::kDouble);
  Lion lion(std::vector<at::Tensor>{p}, LionOptions(0.1));
  lion.step();
  EXPECT_EQ(p.item<double>(), 2.0);
}

TEST(LambMath, OneStepMatchesTheClosedForm) {
  // First step from zero moments with g = [3, 4]: m = 0.1 g, v = 0.001 g^2,
  // so m / sqrt(v) = sign(g) / sqrt(0.1) elementwise.
  const double b1 = 0.9, b2 = 0.999, lr = 0.01, wd = 0.1, eps = 1e-8;
  at::Tensor p = torch::tensor({1.0, 2.0}, torch::kDouble);
  p.mutable_grad() = torch::tensor({3.0, 4.0}, torch::kDouble);
  Lamb lamb(std::vector<at::Tensor>{p}, LambOptions(lr).weight_decay(wd).max_coeff(100));
  lamb.step();
  double u[2], u2 = 0, w2 = 1 + 4;
  const double g[2] = {3, 4}, p0[2] = {1, 2};
  for (int i = 0; i < 2; ++i) {
    u[i] = (1 - b1) * g[i] / (std::sqrt((1 - b2) * g[i] * g[i]) + eps) + wd * p0[i];
    u2 += u[i] * u[i];
  }
  const double ratio = std::sqrt(w2) / std::sqrt(u2);
  const double step_size = lr * std::sqrt(1 - b2) / (1 - b1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(p[i].item<double>(), p0[i] - step_size * ratio * u[i], 1e-12) << i;
  }
}

TEST(LambMath, TheTrustRatioIsClamped) {
  // A large parameter and a tiny update: the ratio |p|/|u| is huge and
  // max_coeff bounds it.
  at::Tensor p = torch::tensor({1000.0}, torch::kDouble);
  p.mutable_grad() = torch::tensor({1.0}, torch::kDouble);
  Lamb lamb(std::vector<at::Tensor>{p}, LambOptions(0.01).max_coeff(2.0).bias_correction(false));
  lamb.step();
  const double u = 0.1 / (std::sqrt(0.001) + 1e-8);
  EXPECT_NEAR(p.item<double>(), 1000.0 - 0.01 * 2.0 * u, 1e-9);
}

TEST(ZeroOptimizerRefusals, LbfgsNamesTheStageThatRunsIt) {
  run_ranks(2, [](ProcessGroup& pg) {
    Recipe r;
    testing::Stack model = testing::make_model(r);
    torch::optim::LBFGS lbfgs(model->parameters(), torch::optim::LBFGSOptions(1));
    ZeroOptions options;
    expect_refusal_naming(
        [&] { ZeroOptimizer zero(model, lbfgs, pg.shared_from_this(), options); },
        "stage 0");
  });
}

TEST(ZeroOptimizerRefusals, AmsgradWithoutAFactoryNamesTheFactory) {
  run_ranks(2, [](ProcessGroup& pg) {
    Recipe r;
    testing::Stack model = testing::make_model(r);
    auto adam = testing::make_optimizer(Opt::kAmsgrad, model->parameters());
    expect_refusal_naming(
        [&] { ZeroOptimizer zero(model, *adam, pg.shared_from_this(), ZeroOptions{}); },
        "shard_optimizer_factory");
  });
}

TEST(ZeroOptimizerRefusals, AFactoryOptimizerRefusesCheckpointsInsteadOfLosingItsState) {
  run_ranks(2, [](ProcessGroup& pg) {
    Recipe r;
    r.opt = Opt::kAmsgrad;
    testing::Stack model = testing::make_model(r);
    auto adam = testing::make_optimizer(r.opt, model->parameters());
    ZeroOptions options;
    testing::set_shard_optimizer(r.opt, options);
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), options);
    expect_refusal_naming([&] { (void)zero.state_names(); }, "save_model");
  });
}

TEST(ZeroOptimizerRefusals, MomentumTurnedOnAfterShardingIsRefused) {
  run_ranks(2, [](ProcessGroup& pg) {
    Recipe r;
    testing::Stack model = testing::make_model(r);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    ZeroOptimizer zero(model, sgd, pg.shared_from_this(), ZeroOptions{});
    static_cast<torch::optim::SGDOptions&>(sgd.param_groups()[0].options()).momentum(0.9);
    auto [x, y] = testing::micro_batch(r, 0, 0, pg.rank(), pg.world_size());
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    expect_refusal_naming([&] { zero.step(); }, "momentum_buffer");
  });
}

}  // namespace
}  // namespace tandem
