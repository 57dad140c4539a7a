// Resharding: a checkpoint saved by ZeRO at world 4 loads at world 2 and 1,
// and into DDP, and DDP's into ZeRO-3, each time giving back the same
// consolidated state (parameters, masters, optimizer state) byte for byte;
// and a DDP checkpoint resumed under ZeRO trains on as the uninterrupted run.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <torch/torch.h>

#include "support/checkpoint_testing.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

using TempDir = testing::ScratchDir;

// Trains `steps` steps (0: none) at `world` ranks with ZeRO `stage` (0: DDP),
// loading `load_from` first when set, and saves to `save_to`.
void run(int world, int stage, int steps, const std::string& load_from,
         const std::string& save_to, testing::Opt opt = testing::Opt::kAdam) {
  testing::Recipe r;
  r.width = 13;  // odd sizes: shards end inside parameters, with padding
  Config config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 97;
  auto gen = at::detail::createCPUGenerator(9);
  const auto x = torch::randn({32, r.in}, gen);
  const auto y = torch::randint(0, r.out, {32}, gen);
  testing::run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack model = testing::make_model(r);
    std::shared_ptr<torch::optim::Optimizer> adam =
        opt == testing::Opt::kAdam
            ? std::make_shared<torch::optim::Adam>(model->parameters(),
                                                   torch::optim::AdamOptions(1e-2))
            : std::shared_ptr<torch::optim::Optimizer>(
                  testing::make_optimizer(opt, model->parameters()));
    accelerator.prepare_model(model);
    DistributedLoaderOptions options;
    options.batch_size = 8 / world;
    auto loader = accelerator.prepare_data_loader({x, y}, options);
    auto optimizer = accelerator.prepare_optimizer(adam);
    if (!load_from.empty()) accelerator.load_state(load_from);
    int done = 0;
    for (auto& batch : *loader) {
      if (done == steps) break;
      optimizer->zero_grad();
      accelerator.backward(torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
      optimizer->step();
      if (++done == steps) break;  // the loader's position: exactly `steps` batches
    }
    accelerator.save_state(save_to);
  });
}

TEST(Reshard, Zero2AtWorld4LoadsAtWorld2AndWorld1WithTheSameConsolidatedState) {
  TempDir w4, w2, w1;
  run(4, 2, 3, "", w4.path());
  const auto saved = testing::consolidated(w4.path());
  ASSERT_TRUE(saved.count("optim/exp_avg/block0.fc.weight"));
  run(2, 2, 0, w4.path(), w2.path());
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(w2.path()), saved));
  run(1, 2, 0, w2.path(), w1.path());
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(w1.path()), saved));
}

TEST(Reshard, ZeroToDdpAndDdpToZero3KeepTheConsolidatedState) {
  TempDir zero1, ddp, zero3, zero1_again;
  run(4, 1, 3, "", zero1.path());
  const auto saved = testing::consolidated(zero1.path());
  run(2, 0, 0, zero1.path(), ddp.path());
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(ddp.path()), saved));
  run(3, 3, 0, ddp.path(), zero3.path());
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(zero3.path()), saved));
  run(2, 1, 0, zero3.path(), zero1_again.path());
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(zero1_again.path()), saved));
}

// The other optimizers ZeRO shards keep their state under their torch
// names, so it moves between world sizes, stages and DDP the same way.
class ReshardOptimizers : public ::testing::TestWithParam<testing::Opt> {};

std::string reshard_optimizer_name(const ::testing::TestParamInfo<testing::Opt>& info) {
  static const std::vector<std::string> names{"Adagrad", "Rmsprop", "Lion", "Lamb"};
  return names.at(info.index);
}

TEST_P(ReshardOptimizers, Zero2AtWorld3ToZero3AtWorld2ToDdpKeepTheState) {
  const testing::Opt opt = GetParam();
  TempDir w3, w2, ddp;
  run(3, 2, 3, "", w3.path(), opt);
  const auto saved = testing::consolidated(w3.path());
  const std::string first_state =
      opt == testing::Opt::kAdagrad ? "optim/sum/block0.fc.weight"
      : opt == testing::Opt::kRmsprop ? "optim/grad_avg/block0.fc.weight"
                                      : "optim/exp_avg/block0.fc.weight";
  ASSERT_TRUE(saved.count(first_state)) << first_state;
  run(2, 3, 0, w3.path(), w2.path(), opt);
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(w2.path()), saved));
  run(2, 0, 0, w2.path(), ddp.path(), opt);
  EXPECT_TRUE(testing::same_tensors(testing::consolidated(ddp.path()), saved));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ReshardOptimizers,
                         ::testing::Values(testing::Opt::kAdagrad, testing::Opt::kRmsprop,
                                           testing::Opt::kLion, testing::Opt::kLamb),
                         reshard_optimizer_name);

// The largest relative difference between two consolidated states with the
// same tensors.
double max_relative_difference(const std::map<std::string, torch::Tensor>& a,
                               const std::map<std::string, torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [key, t] : a) {
    const auto it = b.find(key);
    if (it == b.end()) {
      ADD_FAILURE() << key << " missing";
      continue;
    }
    const double scale = std::max(t.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (t - it->second).abs().max().item<double>() / scale);
  }
  return worst;
}

// A checkpoint of one process or DDP, resumed under ZeRO, trains on as the
// uninterrupted run does. SGD keeps no step count of its own, and the shards
// must still continue its loaded momentum rather than start it afresh.
using ResumeCase = std::tuple<testing::Opt, int /*stage*/, int /*saving world*/>;
class ResumeUnderZero : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeUnderZero, TrainsOnAsTheUninterruptedRun) {
  const auto [opt, stage, saving_world] = GetParam();
  TempDir whole, half, resumed;
  run(2, stage, 4, "", whole.path(), opt);  // one epoch: 4 steps of 8 samples
  run(saving_world, 0, 2, "", half.path(), opt);
  run(2, stage, 2, half.path(), resumed.path(), opt);
  const auto expected = testing::consolidated(whole.path());
  EXPECT_LT(max_relative_difference(testing::consolidated(resumed.path()), expected), 1e-5);
  EXPECT_GT(max_relative_difference(testing::consolidated(half.path()), expected), 1e-3)
      << "the resumed steps did not move the state";
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ResumeUnderZero,
    ::testing::Combine(::testing::Values(testing::Opt::kSgd, testing::Opt::kAdamW,
                                         testing::Opt::kAdagrad),
                       ::testing::Values(1, 2, 3), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<ResumeCase>& info) {
      const testing::Opt opt = std::get<0>(info.param);
      const std::string name = opt == testing::Opt::kSgd      ? "SgdMomentum"
                               : opt == testing::Opt::kAdamW ? "AdamW"
                                                             : "Adagrad";
      return name + "Stage" + std::to_string(std::get<1>(info.param)) + "SavedAtWorld" +
             std::to_string(std::get<2>(info.param));
    });

// The samples of one epoch of 24 ids (shuffled) each rank's loader hands
// out, after loading `load_from` when given and stopping after `stop`
// batches when given; saves to `save_to` when given.
std::vector<int64_t> epoch_samples(int world, int stop, const std::string& load_from,
                                   const std::string& save_to) {
  std::mutex mutex;
  std::vector<int64_t> seen;
  testing::run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    torch::nn::Linear model(2, 2);  // a checkpoint holds a model
    accelerator.prepare_model(model);
    DistributedLoaderOptions options;
    options.batch_size = 2;
    options.seed = 5;
    auto loader = accelerator.prepare_data_loader({torch::arange(24, torch::kLong)}, options);
    if (!load_from.empty()) accelerator.load_state(load_from);
    int done = 0;
    for (auto& batch : *loader) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        for (int64_t i = 0; i < batch[0].size(0); ++i) seen.push_back(batch[0][i].item<int64_t>());
      }
      if (++done == stop) break;
    }
    if (!save_to.empty()) accelerator.save_state(save_to);
  });
  std::sort(seen.begin(), seen.end());
  return seen;
}

// A loader position saved at world 2 resumes at worlds 1, 3 and 4 after the
// same samples of the epoch's order: every sample of the epoch once when
// that falls on a step boundary there; otherwise from the boundary before,
// the samples in between twice and none lost.
TEST(Reshard, TheDataPositionCarriesOverToAnotherWorldSize) {
  TempDir saved;
  std::vector<int64_t> before = epoch_samples(2, 3, "", saved.path());  // 12 of 24
  ASSERT_EQ(before.size(), 12u);
  for (int world : {1, 3, 4}) {
    std::vector<int64_t> after = epoch_samples(world, 0, saved.path(), "");
    std::vector<int64_t> all = before;
    all.insert(all.end(), after.begin(), after.end());
    std::sort(all.begin(), all.end());
    std::vector<int64_t> unique = all;
    unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
    EXPECT_EQ(unique.size(), 24u) << "world " << world << ": a sample was lost";
    // 12 samples are 6, 2 and 1.5 steps at worlds 1, 3 and 4 (batch 2).
    const size_t repeated = world == 4 ? 4 : 0;
    EXPECT_EQ(all.size(), 24u + repeated) << "world " << world;
  }
}

TEST(Reshard, TrainingContinuesAfterAReshardedLoad) {
  // World 4 -> 2 and on: the step count carries over and training stays
  // finite (the resumed Adam uses the loaded moments, not fresh ones).
  TempDir w4, w2;
  run(4, 2, 2, "", w4.path());
  run(2, 2, 2, w4.path(), w2.path());
  const auto tags = checkpoint_tags(w2.path());
  ASSERT_EQ(tags.size(), 1u);
  const auto meta = read_checkpoint_meta(w2 / tags[0]);
  EXPECT_EQ(tags[0], "global_step4");
  EXPECT_EQ(meta["optimizer"]["step"], 4);
  for (const auto& [key, t] : testing::consolidated(w2.path())) {
    EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << key;
  }
}

}  // namespace
}  // namespace tandem
