// A DDP communication hook's state in checkpoints. With ddp.comm_hook:
// powersgd, training N steps straight equals training k steps, saving,
// building everything again, loading and training N - k steps, byte for
// byte: the parameters, the optimizer state and every rank's PowerSGD error
// feedback and Q, at 2 and 3 ranks, with the save before compression starts
// and after, warm start on and off. At another world size, or with the hook
// changed, load_state keeps what still holds and says what it drops.
// Ranks run as threads.

#include <algorithm>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/log_capture.h"
#include "support/checkpoint_testing.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

struct PowerSGDRun {
  int world = 2;
  int64_t start_iter = 3;  // start_powerSGD_iter
  bool warm_start = true;
  std::string comm_hook = "powersgd";
  int64_t stop_at = 8;   // optimizer steps
  int64_t save_at = -1;  // also save_state(dir) after this step
  bool resume = false;   // load_state(dir) first
  std::string final_dir;  // save_state() here at the end
};

constexpr int64_t kPowerSGDBatch = 4;  // per rank and step
constexpr int64_t kPowerSGDRows = 8 * 3 * kPowerSGDBatch;  // 8 steps at 3 ranks

Config powersgd_config(const PowerSGDRun& s) {
  Config config;
  config.ddp.comm_hook = s.comm_hook;
  config.ddp.powersgd.start_powerSGD_iter = s.start_iter;
  config.ddp.powersgd.warm_start = s.warm_start;
  config.ddp.powersgd.matrix_approximation_rank = 2;
  // The model is about 4 KB: 1 KB buckets give PowerSGD several buckets'
  // state to keep.
  config.ddp.bucket_cap_mb = 0.001;
  config.ddp.first_bucket_cap_mb = 0.001;
  return config;
}

// The testing Stack under AdamW through an Accelerator, each rank on its
// own rows of a fixed data set, one optimizer step per batch.
void train_powersgd(const PowerSGDRun& s, const std::string& dir) {
  testing::Recipe r;
  const Config config = powersgd_config(s);
  auto gen = at::detail::createCPUGenerator(7);
  // The same data set for every segment, whatever its length.
  const auto x = torch::randn({kPowerSGDRows, r.in}, gen);
  const auto y = torch::randint(0, r.out, {x.size(0)}, gen);
  testing::run_ranks(s.world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Stack model = testing::make_model(r);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(std::make_shared<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(1e-2)));
    if (s.resume) accelerator.load_state(dir);
    while (accelerator.step() < s.stop_at) {
      const int64_t row = (accelerator.step() * s.world + pg.rank()) * kPowerSGDBatch;
      optimizer->zero_grad();
      accelerator.backward(torch::nn::functional::cross_entropy(
          model->forward(x.narrow(0, row, kPowerSGDBatch)), y.narrow(0, row, kPowerSGDBatch)));
      optimizer->step();
      if (accelerator.step() == s.save_at) accelerator.save_state(dir);
    }
    accelerator.save_state(s.final_dir);
  });
}

// The largest |a - b| over the parameters of two checkpoints, for messages.
double max_parameter_difference(const std::string& a, const std::string& b) {
  const auto ta = testing::consolidated(a), tb = testing::consolidated(b);
  double out = 0;
  for (const auto& [key, t] : ta) {
    if (key.rfind("model/", 0) != 0 || !tb.count(key)) continue;
    out = std::max(out, (t - tb.at(key)).abs().max().item<double>());
  }
  return out;
}

const nlohmann::json& hook_meta(const nlohmann::json& meta) {
  return meta.at("models").at(0).at("comm_hook");
}

void expect_exact_powersgd_resume(int world, int64_t start_iter, int64_t save_at,
                                  bool warm_start = true) {
  testing::ScratchDir straight, interrupted, resumed;
  PowerSGDRun a;
  a.world = world;
  a.start_iter = start_iter;
  a.warm_start = warm_start;
  a.final_dir = straight.path();
  train_powersgd(a, "");

  PowerSGDRun first = a;
  first.stop_at = save_at;
  first.save_at = save_at;
  first.final_dir = interrupted / "unused";
  train_powersgd(first, interrupted.path());
  PowerSGDRun second = a;
  second.resume = true;
  second.final_dir = resumed.path();
  train_powersgd(second, interrupted.path());

  const std::string tag = "global_step" + std::to_string(a.stop_at);
  EXPECT_TRUE(testing::same_tensors(testing::rank_files(straight.path(), tag),
                                    testing::rank_files(resumed.path(), tag)))
      << "max |straight - resumed| over the parameters: "
      << max_parameter_difference(straight.path(), resumed.path());
  const auto meta_a = read_checkpoint_meta(straight / tag);
  const auto meta_b = read_checkpoint_meta(resumed / tag);
  EXPECT_EQ(hook_meta(meta_a), hook_meta(meta_b));
  // The run did compress, with state kept per bucket and rank.
  EXPECT_EQ(hook_meta(meta_a).at("iteration"), a.stop_at);
  EXPECT_GT(hook_meta(meta_a).at("buckets").size(), 1u);
  EXPECT_EQ(hook_meta(meta_a).at("errors").size(), hook_meta(meta_a).at("buckets").size());
}

TEST(PowerSGDResume, SavedAfterCompressionStartsResumesExactlyAtWorld2) {
  expect_exact_powersgd_resume(2, /*start_iter=*/3, /*save_at=*/5);
}
TEST(PowerSGDResume, SavedAfterCompressionStartsResumesExactlyAtWorld3) {
  expect_exact_powersgd_resume(3, /*start_iter=*/3, /*save_at=*/5);
}
TEST(PowerSGDResume, SavedBeforeCompressionStartsResumesExactlyAtWorlds2And3) {
  expect_exact_powersgd_resume(2, /*start_iter=*/5, /*save_at=*/3);
  expect_exact_powersgd_resume(3, /*start_iter=*/5, /*save_at=*/3);
}
TEST(PowerSGDResume, SavedJustBeforeCompressionStartsResumesExactly) {
  // The first backward after the load compresses: it must already use the
  // saved buckets, not a fresh DDP's, which it rebuilds after that backward.
  expect_exact_powersgd_resume(2, /*start_iter=*/4, /*save_at=*/4);
}
TEST(PowerSGDResume, WithoutWarmStartFreshQsContinueTheSeedStream) {
  expect_exact_powersgd_resume(2, /*start_iter=*/3, /*save_at=*/5, /*warm_start=*/false);
}

// Trains `run` for 5 steps and saves them into `dir`.
void train_and_save_5_steps(PowerSGDRun run, const testing::ScratchDir& dir) {
  run.stop_at = run.save_at = 5;
  run.final_dir = dir / "unused";
  train_powersgd(run, dir.path());
}

TEST(PowerSGDResume, AtAnotherWorldSizeTheIterationResumesAndPerRankStateStartsAfresh) {
  testing::ScratchDir saved, resumed;
  train_and_save_5_steps(PowerSGDRun{}, saved);
  PowerSGDRun second;
  second.world = 3;
  second.stop_at = 7;
  second.resume = true;
  second.final_dir = resumed.path();
  const std::string log = testing::info_log_of([&] { train_powersgd(second, saved.path()); });
  EXPECT_NE(log.find("saved by 2 ranks and this run has 3"), std::string::npos) << log;
  EXPECT_NE(log.find("error feedback starting afresh"), std::string::npos) << log;
  // 5 saved + 2 here: not 2, which would redo start_powerSGD_iter plain steps.
  EXPECT_EQ(hook_meta(read_checkpoint_meta(resumed / "global_step7")).at("iteration"), 7);
}

TEST(PowerSGDResume, LoadingIntoAnotherHookSaysThePowerSGDStateIsUnused) {
  testing::ScratchDir saved, resumed;
  train_and_save_5_steps(PowerSGDRun{}, saved);
  PowerSGDRun second;
  second.comm_hook = "none";
  second.stop_at = 6;
  second.resume = true;
  second.final_dir = resumed.path();
  const std::string log = testing::info_log_of([&] { train_powersgd(second, saved.path()); });
  EXPECT_NE(log.find("holds the PowerSGD state of model 0 (iteration 5"), std::string::npos)
      << log;
  EXPECT_NE(log.find("'average' hook; that state is not used"), std::string::npos) << log;

  // And the other way: PowerSGD over a checkpoint without its state starts
  // afresh, and says so.
  testing::ScratchDir plain, resumed_again;
  PowerSGDRun third;
  third.comm_hook = "none";
  train_and_save_5_steps(third, plain);
  PowerSGDRun fourth;
  fourth.stop_at = 6;
  fourth.resume = true;
  fourth.final_dir = resumed_again.path();
  const std::string log2 = testing::info_log_of([&] { train_powersgd(fourth, plain.path()); });
  EXPECT_NE(log2.find("saved with the 'average' hook), so PowerSGD starts afresh"),
            std::string::npos)
      << log2;
}

}  // namespace
}  // namespace tandem
