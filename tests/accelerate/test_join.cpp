// Join mode for uneven inputs (Accelerator::join_uneven_inputs): ranks with
// different batch counts train together without padding and without hanging,
// stay bit-identical, and match a single process that at each step averages
// the gradients of the ranks that had a real batch: under DDP, ZeRO 1-3 and
// HSDP (with and without CPU offload).

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/checkpoint_testing.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::Params;
using testing::run_ranks;

constexpr int64_t kRows = 4;  // samples per batch

struct JoinRun {
  std::vector<int64_t> batches;  // per rank; the world size is its length
  int stage = 0;                 // ZeRO stage, 0: DDP
  int hpz = 1;                   // zero_hpz_partition_size (> 1: HSDP)
  bool offload = false;          // optimizer state and parameters on the CPU
  int64_t accumulation = 1;
  double clip = 0.0;  // > 0: the config's gradient_clipping
  int epochs = 2;
  // Checkpoints: save_state(save_dir) and stop after `stop_after` loop
  // bodies; or load_state(load_dir) before training.
  std::string save_dir;
  int64_t stop_after = -1;
  std::string load_dir;
};

JoinRun join_run(std::vector<int64_t> batches, int stage = 0) {
  JoinRun run;
  run.batches = std::move(batches);
  run.stage = stage;
  return run;
}

testing::Recipe recipe() {
  testing::Recipe r;
  r.depth = 2;
  return r;
}

// Rank `rank`'s own data: `batches` batches of kRows samples.
std::pair<at::Tensor, at::Tensor> rank_data(int rank, int64_t batches) {
  const testing::Recipe r = recipe();
  auto gen = at::detail::createCPUGenerator(500 + rank);
  auto x = torch::randn({batches * kRows, r.in}, gen);
  auto y = torch::randint(0, r.out, {batches * kRows}, gen);
  return {x, y};
}

at::Tensor loss_of(testing::Stack& model, const DistributedLoader::Batch& batch) {
  return torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
}

struct Outcome {
  std::vector<Params> params;       // per rank
  std::vector<int64_t> iterations;  // loop bodies run, per rank
  std::vector<int64_t> shadows;     // of which shadow ones, per rank
  std::vector<int64_t> steps;       // optimizer steps, per rank
  std::vector<int64_t> replicate_bytes;  // HSDP's traffic across shard groups
};

Outcome train_joined(const JoinRun& run) {
  const int world = static_cast<int>(run.batches.size());
  Config config;
  config.gradient_accumulation_steps = run.accumulation;
  if (run.clip > 0) config.gradient_clipping = run.clip;
  config.zero.stage = run.stage;
  config.zero.hpz_partition_size = run.hpz;
  if (run.offload) {
    config.zero.offload_optimizer = OffloadDevice::kCpu;
    if (run.stage == 3) config.zero.offload_param = OffloadDevice::kCpu;
  }
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 200;  // several buckets even for this model
  AcceleratorOptions options;
  DDPOptions ddp;
  ddp.bucket_cap_mb = ddp.first_bucket_cap_mb = 0.002;  // several buckets
  ddp.cache_cpu_allocations = false;
  options.ddp = ddp;
  Outcome out;
  out.params.resize(world);
  out.iterations.assign(world, 0);
  out.shadows.assign(world, 0);
  out.steps.assign(world, 0);
  out.replicate_bytes.assign(world, 0);
  std::mutex mutex;
  run_ranks(world, [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    Accelerator accelerator(pg.shared_from_this(), config, options);
    testing::Stack model = testing::make_model(recipe());
    auto adam = std::make_shared<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    auto [x, y] = rank_data(rank, run.batches[static_cast<size_t>(rank)]);
    DistributedLoaderOptions loader_options;
    loader_options.batch_size = kRows;
    loader_options.shuffle = false;
    // This rank's own data, not resharded: counts differ across ranks.
    auto loader = accelerator.prepare_local_loader(DistributedLoader({x, y}, 1, 0, loader_options));
    auto optimizer = accelerator.prepare_optimizer(adam);
    if (!run.load_dir.empty()) accelerator.load_state(run.load_dir);
    int64_t iterations = 0;
    int64_t shadows = 0;
    {
      auto join = accelerator.join_uneven_inputs();
      bool stopped = false;
      for (int epoch = 0; epoch < run.epochs && !stopped; ++epoch) {
        for (auto& batch : *loader) {
          optimizer->zero_grad();
          accelerator.backward(loss_of(model, batch));
          optimizer->step();
          ++iterations;
          shadows += accelerator.is_shadow_batch() ? 1 : 0;
          if (iterations == run.stop_after) {
            accelerator.save_state(run.save_dir);
            stopped = true;
            break;
          }
        }
      }
    }
    std::optional<ZeroOptimizer::GatheredParameters> whole;
    if (run.stage == 3) whole.emplace(*accelerator.zero_optimizer());
    std::lock_guard<std::mutex> lock(mutex);
    out.params[static_cast<size_t>(rank)] = testing::snapshot(*model);
    out.iterations[static_cast<size_t>(rank)] = iterations;
    out.shadows[static_cast<size_t>(rank)] = shadows;
    out.steps[static_cast<size_t>(rank)] = accelerator.step();
    if (auto zero = accelerator.zero_optimizer()) {
      out.replicate_bytes[static_cast<size_t>(rank)] = zero->comm_stats().replicate_bytes;
    }
  });
  return out;
}

// One process: at micro-step m the gradient is the mean of the per-rank
// gradients of the ranks with a batch at m, divided by the accumulation
// steps; the optimizer steps every `accumulation` micro-steps and at the end
// of the pass.
Params reference(const JoinRun& run) {
  const testing::Recipe r = recipe();
  testing::Stack model = testing::make_model(r);
  auto adam = std::make_shared<torch::optim::Adam>(
      model->parameters(), torch::optim::AdamOptions(1e-2));
  const int world = static_cast<int>(run.batches.size());
  std::vector<std::pair<at::Tensor, at::Tensor>> data;
  for (int rank = 0; rank < world; ++rank) data.push_back(rank_data(rank, run.batches[rank]));
  const int64_t length = *std::max_element(run.batches.begin(), run.batches.end());
  const auto params = model->parameters();
  for (int epoch = 0; epoch < run.epochs; ++epoch) {
    std::vector<at::Tensor> step_grad;
    for (const auto& p : params) step_grad.push_back(torch::zeros_like(p));
    int64_t in_cycle = 0;
    for (int64_t m = 0; m < length; ++m) {
      std::vector<at::Tensor> sum;
      for (const auto& p : params) sum.push_back(torch::zeros_like(p));
      int64_t k = 0;
      for (int rank = 0; rank < world; ++rank) {
        if (m >= run.batches[rank]) continue;
        ++k;
        model->zero_grad();
        const auto& [x, y] = data[rank];
        DistributedLoader::Batch batch = {x.narrow(0, m * kRows, kRows),
                                          y.narrow(0, m * kRows, kRows)};
        loss_of(model, batch).backward();
        for (size_t i = 0; i < params.size(); ++i) sum[i] += params[i].grad();
      }
      for (size_t i = 0; i < params.size(); ++i) {
        step_grad[i] += sum[i] / static_cast<double>(k) / static_cast<double>(run.accumulation);
      }
      if (++in_cycle == run.accumulation || m == length - 1) {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = step_grad[i].clone();
        if (run.clip > 0) torch::nn::utils::clip_grad_norm_(params, run.clip);
        adam->step();
        for (auto& g : step_grad) g.zero_();
        in_cycle = 0;
      }
    }
  }
  return testing::snapshot(*model);
}

void expect_identical_across_ranks(const Outcome& out) {
  for (size_t rank = 1; rank < out.params.size(); ++rank) {
    for (const auto& [name, p] : out.params[0]) {
      EXPECT_TRUE(torch::equal(p, out.params[rank].at(name)))
          << name << " differs between rank 0 and rank " << rank;
    }
  }
}

void expect_matches_reference(const JoinRun& run, double tolerance) {
  const Outcome out = train_joined(run);
  const int64_t length = *std::max_element(run.batches.begin(), run.batches.end());
  for (size_t rank = 0; rank < run.batches.size(); ++rank) {
    EXPECT_EQ(out.iterations[rank], run.epochs * length) << "rank " << rank;
    EXPECT_EQ(out.shadows[rank], run.epochs * (length - run.batches[rank])) << "rank " << rank;
  }
  const int64_t steps_per_epoch = (length + run.accumulation - 1) / run.accumulation;
  EXPECT_EQ(out.steps[0], run.epochs * steps_per_epoch);
  expect_identical_across_ranks(out);
  for (size_t rank = 0; rank < run.batches.size(); ++rank) {
    EXPECT_EQ(out.replicate_bytes[rank] > 0, run.hpz > 1) << "rank " << rank;
  }
  const double diff = testing::max_relative_diff(out.params[0], reference(run));
  EXPECT_LE(diff, tolerance) << "stage " << run.stage << ", world " << run.batches.size();
}

TEST(Join, DdpWithUnevenBatchesEqualsTheSingleProcessMeanOverRanksWithData) {
  // W / K is 1 or 2 in a world of 2: the weighting is exact, and so is DDP.
  expect_matches_reference(join_run({5, 3}), 0.0);
  // W / K = 3 / 2 rounds: ~3e-6 after ten Adam steps.
  expect_matches_reference(join_run({2, 5, 3}), 1e-5);
}

TEST(Join, ZeroStagesWithUnevenBatchesEqualTheSingleProcessReference) {
  for (int stage : {1, 2, 3}) {
    expect_matches_reference(join_run({5, 3}, stage), 1e-5);
    expect_matches_reference(join_run({2, 5, 3}, stage), 1e-5);
  }
}

TEST(Join, HsdpWithUnevenBatchesEqualsTheSingleProcessReference) {
  // Shard groups of 2 replicated across 2 or 3 groups: a shadow step must
  // still take part in the replicate all-reduce of its gradient shard.
  for (int stage : {2, 3}) {
    for (const std::vector<int64_t>& batches :
         {std::vector<int64_t>{2, 5, 3, 1}, std::vector<int64_t>{4, 1, 3, 5, 2, 4}}) {
      JoinRun run = join_run(batches, stage);
      run.hpz = 2;
      expect_matches_reference(run, 1e-5);
    }
  }
}

TEST(Join, HsdpWithCpuOffloadAndUnevenBatchesEqualsTheSingleProcessReference) {
  for (int stage : {2, 3}) {
    JoinRun run = join_run({2, 5, 3, 1}, stage);
    run.hpz = 2;
    run.offload = true;
    run.accumulation = 2;
    run.clip = 0.05;
    expect_matches_reference(run, 3e-5);
  }
}

TEST(Join, AccumulationCountsShadowMicroStepsAndClipsTheAgreedGradient) {
  for (int stage : {0, 2, 3}) {
    JoinRun run = join_run({5, 2, 4}, stage);
    run.accumulation = 2;
    run.clip = 0.05;
    // W/K = 3/2 and a mean over three ranks are inexact in fp32, and clipping
    // rescales every gradient by the rounded global norm: a few ulps of
    // drift, seen at 1.1e-5 with other intra-op thread counts.
    expect_matches_reference(run, 3e-5);
  }
}

TEST(Join, ResumingAJoinedPassFromACheckpointEqualsTheUninterruptedRun) {
  testing::ScratchDir dir;
  const JoinRun full = join_run({5, 3});
  const Outcome uninterrupted = train_joined(full);
  // Saved after step 4 of 5: rank 1 is on a shadow batch.
  JoinRun first = full;
  first.save_dir = dir.path();
  first.stop_after = 4;
  const Outcome before = train_joined(first);
  EXPECT_EQ(before.shadows, (std::vector<int64_t>{0, 1}));
  JoinRun rest = full;
  rest.load_dir = dir.path();
  const Outcome after = train_joined(rest);
  // The rest of epoch 0 (one batch, a shadow one on rank 1), then epoch 1.
  EXPECT_EQ(after.iterations, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(after.shadows, (std::vector<int64_t>{0, 3}));
  expect_identical_across_ranks(after);
  EXPECT_EQ(testing::max_relative_diff(after.params[0], uninterrupted.params[0]), 0.0);
}

// The loader side, over one dataset sharded by prepare_data: 7 samples of
// batch 1 on 2 ranks are 4 and 3 batches without padding.
struct PassLog {
  std::vector<int64_t> ids;  // sample ids gathered with gather_for_metrics
  std::vector<std::vector<int64_t>> k;      // per rank: ranks_with_data per batch
  std::vector<std::vector<int>> shadow;     // per rank: shadow flag per batch
  std::vector<std::vector<int>> last;       // per rank: end_of_dataloader per batch
  std::vector<int64_t> plain_batches;       // per rank: batches of a pass outside the guard
};

PassLog log_passes(bool even_batches) {
  const int world = 2;
  PassLog log;
  log.k.resize(world);
  log.shadow.resize(world);
  log.last.resize(world);
  log.plain_batches.assign(world, 0);
  std::mutex mutex;
  const auto ids = torch::arange(7, torch::kLong).unsqueeze(1);
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    DistributedLoaderOptions options;
    options.batch_size = 1;
    options.shuffle = false;
    options.even_batches = even_batches;
    auto loader = accelerator.prepare_data_loader({ids}, options);
    std::vector<int64_t> k, last;
    std::vector<int> shadow, end;
    std::vector<int64_t> gathered;
    {
      auto join = accelerator.join_uneven_inputs();
      for (auto& batch : *loader) {
        k.push_back(accelerator.ranks_with_data());
        shadow.push_back(accelerator.is_shadow_batch() ? 1 : 0);
        end.push_back(accelerator.gradient_state().end_of_dataloader ? 1 : 0);
        const auto all = accelerator.gather_for_metrics(batch[0].view({-1}));
        for (int64_t i = 0; i < all.numel(); ++i) gathered.push_back(all[i].item<int64_t>());
      }
    }
    int64_t plain = 0;
    for (auto& batch : *loader) {
      (void)batch;
      EXPECT_FALSE(accelerator.is_shadow_batch());
      ++plain;
    }
    std::lock_guard<std::mutex> lock(mutex);
    log.k[pg.rank()] = k;
    log.shadow[pg.rank()] = shadow;
    log.last[pg.rank()] = end;
    log.plain_batches[pg.rank()] = plain;
    if (pg.rank() == 0) log.ids = gathered;
  });
  return log;
}

TEST(Join, AJoinedPassRunsTheLongestRanksBatchesWithShadowStepsAndNoPadding) {
  for (bool even_batches : {true, false}) {
    const PassLog log = log_passes(even_batches);
    // Joined: no padding whatever the loader's setting, rank 1 shadows once.
    EXPECT_EQ(log.k[0], (std::vector<int64_t>{2, 2, 2, 1}));
    EXPECT_EQ(log.k[1], log.k[0]);
    EXPECT_EQ(log.shadow[0], (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(log.shadow[1], (std::vector<int>{0, 0, 0, 1}));
    EXPECT_EQ(log.last[0], (std::vector<int>{0, 0, 0, 1}));
    EXPECT_EQ(log.last[1], log.last[0]);
    // gather_for_metrics drops the shadow rows: every sample exactly once.
    EXPECT_EQ(log.ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
    // After the guard the loader's own setting is back: padding gives 4 and 4.
    EXPECT_EQ(log.plain_batches,
              even_batches ? (std::vector<int64_t>{4, 4}) : (std::vector<int64_t>{4, 3}));
  }
}

TEST(Join, ResumingPastARanksDataRunsShadowStepsOnItsLastBatch) {
  const auto ids = torch::arange(7, torch::kLong).unsqueeze(1);
  std::vector<std::vector<int64_t>> seen(2);
  std::mutex mutex;
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    DistributedLoaderOptions options;
    options.batch_size = 1;
    options.shuffle = false;
    auto loader = accelerator.prepare_data_loader({ids}, options);
    auto join = accelerator.join_uneven_inputs();
    loader->skip_first_batches(3);  // rank 1 has 3 batches: none left
    std::vector<int64_t> mine;
    while (auto batch = loader->next()) {
      mine.push_back((*batch)[0].item<int64_t>());
      EXPECT_EQ(accelerator.is_shadow_batch(), pg.rank() == 1);
      EXPECT_EQ(loader->position(), 4);
    }
    std::lock_guard<std::mutex> lock(mutex);
    seen[pg.rank()] = mine;
  });
  EXPECT_EQ(seen[0], (std::vector<int64_t>{6}));  // rank 0's batch 3: sample 6
  EXPECT_EQ(seen[1], (std::vector<int64_t>{5}));  // rank 1's last batch: sample 5
}

TEST(Join, WithoutJoinUnevenLoadersKeepTheirExactShares) {
  const auto ids = torch::arange(7, torch::kLong).unsqueeze(1);
  std::vector<int64_t> counts(2, -1);
  std::mutex mutex;
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    DistributedLoaderOptions options;
    options.batch_size = 1;
    options.even_batches = false;
    auto loader = accelerator.prepare_data_loader({ids}, options);
    int64_t n = 0;
    for (auto& batch : *loader) {
      (void)batch;
      EXPECT_FALSE(accelerator.gradient_state().joining);
      EXPECT_EQ(accelerator.ranks_with_data(), 2);
      ++n;
    }
    std::lock_guard<std::mutex> lock(mutex);
    counts[pg.rank()] = n;
  });
  EXPECT_EQ(counts, (std::vector<int64_t>{4, 3}));
}

// BatchNorm statistics in a joined pass come from the highest rank that
// still has a real batch, as PyTorch's Join takes its authoritative rank:
// ranks repeating a stand-in batch must not overwrite everyone's statistics
// with it. Ranks with 1, 3 and 2 batches: the sources are ranks 2, 2, 1, so
// the final running mean is the BatchNorm of rank 2's batches 1 and 2, then
// rank 1's batch 3 (the BatchNorm is the first layer: its input is the raw
// data). Before, rank 0's one batch was counted three times.
TEST(Join, BatchNormStatisticsComeFromTheHighestRankWithData) {
  const std::vector<int64_t> batches = {1, 3, 2};
  static constexpr int64_t kBnIn = 5;
  auto data_of = [](int rank, int64_t n) {
    auto gen = at::detail::createCPUGenerator(700 + rank);
    return std::make_pair(torch::randn({n * kRows, kBnIn}, gen) * (rank + 1) + rank,
                          torch::randint(0, 3, {n * kRows}, gen));
  };
  auto make_model = [] {
    torch::manual_seed(4);
    return torch::nn::Sequential(torch::nn::BatchNorm1d(kBnIn), torch::nn::Linear(kBnIn, 3));
  };
  std::vector<torch::nn::Sequential> models;
  for (std::size_t r = 0; r < batches.size(); ++r) models.push_back(make_model());
  // Expected: the sources' batches through one BatchNorm, in step order.
  torch::nn::BatchNorm1d expected(kBnIn);
  {
    torch::NoGradGuard no_grad;
    const auto r2 = data_of(2, 2).first;
    const auto r1 = data_of(1, 3).first;
    expected->forward(r2.narrow(0, 0, kRows));
    expected->forward(r2.narrow(0, kRows, kRows));
    expected->forward(r1.narrow(0, 2 * kRows, kRows));
  }
  std::vector<at::Tensor> means(batches.size());
  run_ranks(static_cast<int>(batches.size()), [&](ProcessGroup& pg) {
    const int rank = pg.rank();
    Accelerator accelerator(pg.shared_from_this(), Config{});
    torch::nn::Sequential model = models[static_cast<std::size_t>(rank)];
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)));
    auto [x, y] = data_of(rank, batches[static_cast<std::size_t>(rank)]);
    DistributedLoaderOptions loader_options;
    loader_options.batch_size = kRows;
    loader_options.shuffle = false;
    auto loader =
        accelerator.prepare_local_loader(DistributedLoader({x, y}, 1, 0, loader_options));
    {
      auto join = accelerator.join_uneven_inputs();
      for (auto& batch : *loader) {
        optimizer->zero_grad();
        accelerator.backward(
            torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]));
        optimizer->step();
      }
    }
    means[static_cast<std::size_t>(rank)] = model->named_buffers()["0.running_mean"].clone();
  });
  for (std::size_t r = 0; r < means.size(); ++r) {
    EXPECT_TRUE(torch::allclose(means[r], expected->running_mean, 1e-6, 1e-6))
        << "rank " << r << ": " << means[r] << " want " << expected->running_mean;
  }
}

TEST(Join, MisuseGivesAClearError) {
  const auto ids = torch::arange(7, torch::kLong).unsqueeze(1);
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    auto join = accelerator.join_uneven_inputs();
    try {
      auto second = accelerator.join_uneven_inputs();
      ADD_FAILURE() << "a second guard was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("already alive"), std::string::npos) << e.what();
    }
    // A rank with no data at all has nothing to shadow with: every rank
    // throws at the start of the pass, none hangs.
    DistributedLoaderOptions options;
    options.batch_size = 1;
    auto tiny = accelerator.prepare_data_loader({ids.narrow(0, 0, 1)}, options);
    try {
      tiny->next();
      ADD_FAILURE() << "a joined pass with an empty rank started";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("rank(s) 1 of 2 have no batch"), std::string::npos)
          << e.what();
    }
    // Backward in a joined pass needs the prepared model.
    auto loader = accelerator.prepare_data_loader({ids.to(torch::kFloat)}, options);
    auto batch = loader->next();
    auto w = torch::ones({1}, torch::requires_grad());
    try {
      accelerator.backward(((*batch)[0] * w).sum());
      ADD_FAILURE() << "backward without a prepared model was accepted in a joined pass";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("no model was prepared"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace tandem
