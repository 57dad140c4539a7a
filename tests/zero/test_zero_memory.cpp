// Per-rank model-state bytes follow ZeRO's accounting (fp32 Adam, Ψ
// parameters, N ranks), within 10%: DDP 16Ψ, stage 1 4Ψ + 4Ψ + 8Ψ/N,
// stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N. And stage 3 really frees storage.

#include <gtest/gtest.h>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"

namespace tandem {
namespace {

using testing::Recipe;
using testing::run_ranks;

double formula(int stage, double psi, int n) {
  switch (stage) {
    case 1: return 4 * psi + 4 * psi + 8 * psi / n;
    case 2: return 4 * psi + 12 * psi / n;
    case 3: return 16 * psi / n;
  }
  return 16 * psi;
}

Recipe all_sharded() {
  Recipe r;
  r.loose = false;  // every parameter inside a Sharded unit
  r.width = 128;
  r.in = r.width;
  r.out = r.width;
  r.depth = 4;
  r.steps = 2;
  r.accumulation = 1;
  return r;
}

class ZeroMemory : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ZeroMemory, ModelStateBytesFollowTheFormula) {
  auto [stage, world] = GetParam();
  Recipe r = all_sharded();
  ZeroOptions options;
  options.stage = stage;
  options.reduce_bucket_size = 20'000;
  run_ranks(world, [&](ProcessGroup& pg) {
    double psi = 0;
    testing::train_zero(pg, r, options, [&](ZeroOptimizer& zero, testing::Stack& model) {
      psi = 0;
      for (const auto& p : model->parameters()) psi += static_cast<double>(p.numel());
      const double bytes = static_cast<double>(zero.memory_stats().model_state_bytes());
      const double expected = formula(stage, psi, world);
      EXPECT_NEAR(bytes / expected, 1.0, 0.10)
          << "stage " << stage << " world " << world << ": " << bytes << " bytes vs formula "
          << expected;
    });
    EXPECT_GT(psi, 60'000);
  });
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, ZeroMemory,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 4)));

TEST(ZeroMemory, DdpBaselineIsSixteenBytesPerParameter) {
  // The DDP side of the comparison, measured the same way: parameters,
  // gradients and torch::optim::Adam's two moments.
  Recipe r = all_sharded();
  run_ranks(2, [&](ProcessGroup& pg) {
    testing::Stack model = testing::make_model(r);
    DDPOptions ddp_options;
    ddp_options.cache_cpu_allocations = false;
    DistributedDataParallel ddp(model, pg.shared_from_this(), ddp_options);
    torch::optim::Adam adam(model->parameters(), 1e-3);
    auto [x, y] = testing::micro_batch(r, 0, 0, pg.rank(), pg.world_size());
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    adam.step();
    double psi = 0, bytes = 0;
    for (const auto& p : model->parameters()) {
      psi += static_cast<double>(p.numel());
      bytes += static_cast<double>(p.nbytes() + p.grad().nbytes());
    }
    for (const auto& state : adam.state()) {
      auto& s = static_cast<torch::optim::AdamParamState&>(*state.second);
      bytes += static_cast<double>(s.exp_avg().nbytes() + s.exp_avg_sq().nbytes());
    }
    EXPECT_NEAR(bytes / (16 * psi), 1.0, 0.01);
  });
}

TEST(ZeroStage3, UnitStorageIsFreedOutsideForwardAndBackward) {
  Recipe r = all_sharded();
  ZeroOptions options;
  options.stage = 3;
  run_ranks(2, [&](ProcessGroup& pg) {
    testing::Stack model = testing::make_model(r);
    torch::optim::Adam adam(model->parameters(), 1e-3);
    ZeroOptimizer zero(model, adam, pg.shared_from_this(), options);
    auto freed = [&] {
      for (const auto& p : model->parameters()) {
        if (p.storage().nbytes() != 0) return false;
      }
      return true;
    };
    EXPECT_TRUE(freed()) << "after construction";
    auto [x, y] = testing::micro_batch(r, 0, 0, pg.rank(), pg.world_size());
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    EXPECT_TRUE(freed()) << "after forward";
    loss.backward();
    EXPECT_TRUE(freed()) << "after backward";
    for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
    zero.step();
    EXPECT_TRUE(freed()) << "after step";
    {
      ZeroOptimizer::GatheredParameters whole(zero);
      EXPECT_FALSE(freed());
      // Changes made while whole are kept.
      torch::NoGradGuard no_grad;
      model->blocks[0]->fc->bias.fill_(0.25);
    }
    EXPECT_TRUE(freed());
    ZeroOptimizer::GatheredParameters whole(zero);
    EXPECT_TRUE(torch::allclose(model->blocks[0]->fc->bias, torch::full({r.width}, 0.25)));
  });
}

TEST(ZeroStage2, FullGradientsAreFreedAndOnlyTheShardRemains) {
  Recipe r = all_sharded();
  ZeroOptions options;
  options.stage = 2;
  options.reduce_bucket_size = 10'000;
  run_ranks(2, [&](ProcessGroup& pg) {
    testing::Stack model = testing::make_model(r);
    torch::optim::Adam adam(model->parameters(), 1e-3);
    ZeroOptimizer zero(model, adam, pg.shared_from_this(), options);
    EXPECT_GT(zero.group_parameter_names().size(), 3u);
    auto [x, y] = testing::micro_batch(r, 0, 0, pg.rank(), pg.world_size());
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    int64_t shard = 0;
    for (const auto& g : zero.gradient_shards()) shard += g.numel();
    int64_t psi = 0;
    for (const auto& p : model->parameters()) {
      psi += p.numel();
      EXPECT_FALSE(p.grad().defined());
    }
    EXPECT_NEAR(static_cast<double>(shard), psi / 2.0, 64);
  });
}

}  // namespace
}  // namespace tandem
