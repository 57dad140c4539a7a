// The Accelerator with zero_optimization.zero_hpz_partition_size (HSDP):
// it trains like DDP with accumulation, clipping and loss scaling, records
// "hsdp" and P in its checkpoints, and its checkpoints load under ZeRO-3
// and DDP (and theirs under HSDP) with training going on as without the
// interruption. A size that does not divide the world is a clear error.

#include <gtest/gtest.h>

#include <optional>

#include <torch/torch.h>

#include "support/checkpoint_testing.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace accelerator_hsdp_test {

using testing::Params;

// How the run holds the model: ZeRO `stage` (0: DDP) with shard groups of
// `p` ranks (1: plain ZeRO; kHpzRanksPerHost: `ranks_per_host`).
struct Held {
  int stage = 3;
  int p = 2;
  int ranks_per_host = -1;  // LauncherEnv::local_world_size
  bool zero3_init = false;  // build under accelerator.zero_init()
};

struct Schedule {
  int world = 4;
  int steps = 2;            // optimizer steps after the load
  std::string load_from;    // a checkpoint directory to resume from first
  std::string save_to;      // where to save after the steps (empty: nowhere)
  bool loss_scaling = false;
  int inf_loss_on_rank1_at_step = -1;
};

struct Outcome {
  Params params;                 // rank 0's, whole
  std::vector<int64_t> skipped;  // per rank
  std::vector<int64_t> replicate_bytes_last_step;
};

Outcome run_held(const Held& held, const Schedule& run) {
  testing::Recipe r;
  r.width = 13;  // odd sizes: shards end inside parameters, with padding
  Config config;
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  config.zero.stage = held.stage;
  config.zero.hpz_partition_size = held.p;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 97;
  config.zero.zero3_init = held.zero3_init;
  AcceleratorOptions accelerator_options;
  if (run.loss_scaling) accelerator_options.loss_scaling = LossScaleConfig{};
  LauncherEnv launcher;
  launcher.local_world_size = held.ranks_per_host;
  auto gen = at::detail::createCPUGenerator(9);
  const auto x = torch::randn({64, r.in}, gen);
  const auto y = torch::randint(0, r.out, {64}, gen);
  Outcome out;
  out.skipped.assign(run.world, -1);
  out.replicate_bytes_last_step.assign(run.world, -1);
  std::mutex mutex;
  testing::run_ranks(run.world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, accelerator_options, launcher);
    std::optional<testing::Stack> built;
    {
      // testing::make_model, under the Accelerator's zero::Init.
      std::lock_guard<std::mutex> lock(testing::init_mutex());
      torch::manual_seed(42);
      auto init = accelerator.zero_init();
      EXPECT_EQ(init.enabled(), held.zero3_init);
      built.emplace(r.in, r.width, r.out, r.depth, r.loose);
    }
    testing::Stack model = *built;
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    DistributedLoaderOptions options;
    options.batch_size = 8 / run.world;
    options.shuffle = false;
    auto loader = accelerator.prepare_data_loader({x, y}, options);
    auto optimizer = accelerator.prepare_optimizer(adam);
    if (!run.load_from.empty()) accelerator.load_state(run.load_from);
    const int64_t start = accelerator.step();
    int micro = 0;
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
      if (pg.rank() == 1 && micro / 2 == run.inf_loss_on_rank1_at_step) {
        loss = loss * std::numeric_limits<double>::infinity();
      }
      accelerator.backward(loss);
      optimizer->step();
      ++micro;
      if (micro == 2 * run.steps) break;
    }
    EXPECT_EQ(micro, 2 * run.steps);
    if (!run.save_to.empty()) accelerator.save_state(run.save_to);
    auto zero = accelerator.zero_optimizer();
    std::optional<ZeroOptimizer::GatheredParameters> whole;
    if (held.stage == 3) whole.emplace(*zero);
    std::lock_guard<std::mutex> lock(mutex);
    out.skipped[pg.rank()] = accelerator.skipped_steps();
    if (zero) out.replicate_bytes_last_step[pg.rank()] = zero->comm_stats().last_step_replicate_bytes;
    if (pg.rank() == 0) {
      EXPECT_EQ(accelerator.step() - start, run.steps - accelerator.skipped_steps());
      out.params = testing::snapshot(*model);
    }
  });
  return out;
}

const Held kDdp{0, 1};
const Held kZero3{3, 1};
const Held kHsdp3{3, 2};
const Held kHsdp2{2, 2};

TEST(AcceleratorHsdp, TrainsLikeDdpWithAccumulationAndClippingAtStages2And3) {
  Schedule run;
  run.steps = 4;
  const Params ddp = run_held(kDdp, run).params;
  for (const Held& held : {kHsdp3, kHsdp2, Held{3, 1}, Held{3, 4}}) {
    const Outcome hsdp = run_held(held, run);
    EXPECT_LT(testing::max_relative_diff(hsdp.params, ddp), 1e-5)
        << "stage " << held.stage << " P " << held.p;
    for (int rank = 0; rank < run.world; ++rank) {
      // Traffic across shard groups exactly when there are several (P = 1
      // is plain ZeRO over the world, and P = 4 one group).
      EXPECT_EQ(hsdp.replicate_bytes_last_step[rank] > 0, held.p > 1 && held.p < run.world)
          << rank;
    }
  }
}

TEST(AcceleratorHsdp, Zero3InitCutsTheUnitsForTheShardGroupAndTrainsTheSame) {
  Schedule run;
  Held cut = kHsdp3;
  cut.zero3_init = true;
  EXPECT_EQ(testing::max_relative_diff(run_held(cut, run).params, run_held(kHsdp3, run).params),
            0.0);
}

TEST(AcceleratorHsdp, HybridShardTakesTheRanksPerHostFromTheLauncher) {
  Schedule run;
  const Params ddp = run_held(kDdp, run).params;
  Held per_host{3, kHpzRanksPerHost, 2};
  const Outcome hsdp = run_held(per_host, run);
  EXPECT_LT(testing::max_relative_diff(hsdp.params, ddp), 1e-5);
  for (int64_t bytes : hsdp.replicate_bytes_last_step) EXPECT_GT(bytes, 0);
}

TEST(AcceleratorHsdp, LossScalingSkipsAnOverflowOnOneRankOnEveryRank) {
  Schedule scaled;
  scaled.loss_scaling = true;
  scaled.steps = 3;
  const Params ddp = run_held(kDdp, scaled).params;
  EXPECT_LT(testing::max_relative_diff(run_held(kHsdp3, scaled).params, ddp), 1e-5);
  Schedule overflow = scaled;
  overflow.inf_loss_on_rank1_at_step = 1;  // rank 1's shard group only
  const Outcome skipped = run_held(kHsdp3, overflow);
  EXPECT_EQ(skipped.skipped, (std::vector<int64_t>{1, 1, 1, 1}));
  for (const auto& [name, p] : skipped.params) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
}

TEST(AcceleratorHsdp, CheckpointsRecordTheStrategyAndEachShardOnce) {
  testing::ScratchDir hsdp, zero3;
  Schedule run;
  run.save_to = hsdp.path();
  run_held(kHsdp3, run);
  const auto tags = checkpoint_tags(hsdp.path());
  ASSERT_EQ(tags.size(), 1u);
  const auto meta = read_checkpoint_meta(hsdp / tags[0]);
  EXPECT_EQ(meta["strategy"], "hsdp");
  EXPECT_EQ(meta["zero_stage"], 3);
  EXPECT_EQ(meta["hpz_partition_size"], 2);
  EXPECT_EQ(meta["models"][0]["strategy"], "hsdp");
  // Ranks 2 and 3 (the second shard group) write no fragments: their
  // shards equal ranks 0 and 1's.
  int fragments = 0;
  for (const auto& [key, t] : testing::rank_files(hsdp.path(), tags[0])) {
    const int rank = std::stoi(key.substr(0, key.find(':')));
    const bool fragment = key.find(":model/") != std::string::npos ||
                          key.find(":optim/") != std::string::npos;
    if (fragment && rank >= 2) ADD_FAILURE() << key;
    fragments += fragment;
  }
  EXPECT_GT(fragments, 0);
  // The same state as ZeRO-3 at the same world writes.
  Schedule same = run;
  same.save_to = zero3.path();
  run_held(kZero3, same);
  const Params saved = testing::consolidated(hsdp.path());
  const Params reference = testing::consolidated(zero3.path());
  EXPECT_EQ(saved.size(), reference.size());
  EXPECT_LT(testing::max_relative_diff(saved, reference), 1e-5);
}

// Two steps under `first`, saved; loaded under `second` for two more: the
// same parameters as four steps under `second` alone.
void expect_resume_continues(const Held& first, const Held& second) {
  testing::ScratchDir dir;
  Schedule whole;
  whole.steps = 4;
  const Params straight = run_held(second, whole).params;
  Schedule before;
  before.save_to = dir.path();
  run_held(first, before);
  Schedule after;
  after.load_from = dir.path();
  const Params resumed = run_held(second, after).params;
  EXPECT_LT(testing::max_relative_diff(resumed, straight), 1e-5)
      << "stage " << first.stage << " P " << first.p << " -> stage " << second.stage << " P "
      << second.p;
}

TEST(AcceleratorHsdp, ItsCheckpointLoadsUnderZero3AndDdpAndTrainingGoesOn) {
  expect_resume_continues(kHsdp3, kZero3);
  expect_resume_continues(kHsdp3, kDdp);
  expect_resume_continues(kHsdp2, Held{2, 1});
}

TEST(AcceleratorHsdp, Zero3AndDdpCheckpointsLoadUnderHsdpAndTrainingGoesOn) {
  expect_resume_continues(kZero3, kHsdp3);
  expect_resume_continues(kDdp, kHsdp3);
  expect_resume_continues(kDdp, kHsdp2);
}

TEST(AcceleratorHsdp, AShardSizeThatDoesNotDivideTheWorldIsAClearError) {
  Config config;
  config.zero.stage = 3;
  config.zero.hpz_partition_size = 3;
  testing::run_ranks(4, [&](ProcessGroup& pg) {
    const std::string message = testing::usage_error_message(
        [&] { Accelerator accelerator(pg.shared_from_this(), config); });
    EXPECT_NE(message.find("zero_hpz_partition_size is 3, which does not divide the world size 4"),
              std::string::npos)
        << message;
  });
  // HYBRID_SHARD with uneven hosts: 3 ranks per host in a world of 4.
  config.zero.hpz_partition_size = kHpzRanksPerHost;
  LauncherEnv launcher;
  launcher.local_world_size = 3;
  testing::run_ranks(4, [&](ProcessGroup& pg) {
    const std::string message = testing::usage_error_message(
        [&] { Accelerator accelerator(pg.shared_from_this(), config, {}, launcher); });
    EXPECT_NE(message.find("HYBRID_SHARD (ranks per host) shards inside groups of 3 rank(s), "
                           "which does not divide the 4 rank(s)"),
              std::string::npos)
        << message;
  });
}

}  // namespace accelerator_hsdp_test
}  // namespace tandem
