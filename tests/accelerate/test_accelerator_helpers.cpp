// Accelerator helpers: collectives with closed-form results, ordering of
// main_process_first, metrics that count every sample once, the unwrapped
// state dict, the metrics log and the progress bar.

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <numeric>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

using testing::run_ranks;

std::shared_ptr<Accelerator> make_accelerator(ProcessGroup& pg) {
  return std::make_shared<Accelerator>(pg.shared_from_this(), Config{});
}

class AcceleratorHelpers : public ::testing::TestWithParam<int> {};

TEST_P(AcceleratorHelpers, GatherConcatenatesRanksInOrderEvenWithUnevenRows) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    const int r = pg.rank();
    // Rank r contributes r + 1 rows of value r.
    auto mine = torch::full({r + 1, 2}, static_cast<float>(r));
    auto all = accelerator->gather(mine);
    ASSERT_EQ(all.size(0), world * (world + 1) / 2);
    int64_t row = 0;
    for (int k = 0; k < world; ++k) {
      for (int i = 0; i <= k; ++i, ++row) {
        EXPECT_EQ(all[row][0].item<float>(), static_cast<float>(k));
      }
    }
    auto scalars = accelerator->gather(torch::tensor(static_cast<double>(r)));
    EXPECT_EQ(scalars.sizes(), torch::IntArrayRef({world}));
    EXPECT_EQ(scalars.sum().item<double>(), world * (world - 1) / 2.0);
  });
}

TEST_P(AcceleratorHelpers, ReduceSumsAndAveragesCopies) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    auto mine = torch::full({3}, static_cast<float>(pg.rank() + 1));
    auto sum = accelerator->reduce(mine, ReduceOp::kSum);
    auto mean = accelerator->reduce(mine, ReduceOp::kAvg);
    EXPECT_EQ(sum[0].item<float>(), world * (world + 1) / 2.0f);
    EXPECT_FLOAT_EQ(mean[2].item<float>(), (world + 1) / 2.0f);
    EXPECT_EQ(mine[0].item<float>(), static_cast<float>(pg.rank() + 1)) << "input changed";
  });
}

TEST_P(AcceleratorHelpers, PadAcrossProcessesPadsToTheLongestRank) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    auto mine = torch::ones({2, pg.rank() + 1});
    auto padded = accelerator->pad_across_processes(mine, 1, -1);
    ASSERT_EQ(padded.sizes(), torch::IntArrayRef({2, world}));
    EXPECT_EQ(padded.sum().item<float>(), 2 * (pg.rank() + 1) - 2 * (world - pg.rank() - 1));
    auto first = accelerator->pad_across_processes(mine, 1, 0, /*pad_first=*/true);
    EXPECT_EQ(first[0][world - 1].item<float>(), 1.0f);
  });
}

TEST_P(AcceleratorHelpers, GatherForMetricsCountsEverySampleExactlyOnce) {
  const int world = GetParam();
  // 10 samples do not split evenly over 3 or 4 ranks: even batches repeat
  // some samples on the last batch, and gather_for_metrics drops them.
  constexpr int64_t kSamples = 10;
  run_ranks(world, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    auto ids = torch::arange(kSamples, torch::kLong);
    auto loader = accelerator->prepare_data_loader(std::vector<torch::Tensor>{ids}, 2);
    std::vector<int64_t> seen;
    for (auto& batch : *loader) {
      auto all = accelerator->gather_for_metrics(batch[0]);
      for (int64_t i = 0; i < all.size(0); ++i) seen.push_back(all[i].item<int64_t>());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> expected(kSamples);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(seen, expected);
  });
}

// Accelerate's sharding (split_batches, dispatch_batches) pads the last
// round with the epoch's first samples in other places than the
// DistributedSampler does: gather_for_metrics still returns every sample
// exactly once, as Accelerate's does (dispatching pads whatever
// even_batches says).
TEST_P(AcceleratorHelpers, GatherForMetricsCountsEverySampleOnceUnderAcceleratesSharding) {
  const int world = GetParam();
  struct Mode {
    bool split, dispatch, even;
  };
  const std::vector<Mode> modes = {{true, false, true},
                                   {false, true, true},
                                   {true, true, true},
                                   {false, true, false},
                                   {true, true, false}};
  for (const Mode& mode : modes) {
    for (int64_t samples : {5, 10, 13}) {
      for (int64_t batch : {2, 3}) {
        run_ranks(world, [&](ProcessGroup& pg) {
          AcceleratorOptions options;
          options.split_batches = mode.split;
          options.dispatch_batches = mode.dispatch;
          Accelerator accelerator(pg.shared_from_this(), Config{}, options);
          DistributedLoaderOptions loading;
          // With split_batches the loader's batch is the global one.
          loading.batch_size = mode.split ? batch * world : batch;
          loading.shuffle = false;
          loading.even_batches = mode.even;
          auto loader = accelerator.prepare_data_loader(
              std::vector<torch::Tensor>{torch::arange(samples, torch::kLong)}, loading);
          std::vector<int64_t> seen;
          for (auto& rows : *loader) {
            auto all = accelerator.gather_for_metrics(rows[0]);
            for (int64_t i = 0; i < all.size(0); ++i) seen.push_back(all[i].item<int64_t>());
          }
          std::sort(seen.begin(), seen.end());
          std::vector<int64_t> expected(samples);
          std::iota(expected.begin(), expected.end(), 0);
          EXPECT_EQ(seen, expected) << "split " << mode.split << " dispatch " << mode.dispatch
                                    << " even " << mode.even << " samples " << samples
                                    << " batch " << batch;
        });
      }
    }
  }
}

TEST_P(AcceleratorHelpers, GatherForMetricsKeepsEverySampleWithoutEvenBatches) {
  const int world = GetParam();
  constexpr int64_t kSamples = 11;
  run_ranks(world, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    DistributedLoaderOptions options;
    options.batch_size = 4;
    options.shuffle = false;
    options.even_batches = false;  // ranks may hold different row counts
    auto loader =
        accelerator->prepare_data_loader({torch::arange(kSamples, torch::kLong)}, options);
    std::vector<int64_t> seen;
    // Ranks may have different batch counts here: drive every rank through
    // the longest pass, gathering an empty tensor where a rank has no batch.
    const int64_t passes = (kSamples + world * 4 - 1) / (world * 4);
    for (int64_t i = 0; i < passes; ++i) {
      auto batch = loader->next();
      auto rows = batch ? (*batch)[0] : torch::empty({0}, torch::kLong);
      auto all = accelerator->gather_for_metrics(rows);
      for (int64_t k = 0; k < all.size(0); ++k) seen.push_back(all[k].item<int64_t>());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> expected(kSamples);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(seen, expected);
  });
}

INSTANTIATE_TEST_SUITE_P(World1To4, AcceleratorHelpers, ::testing::Values(1, 2, 3, 4));

TEST(AcceleratorHelpers, MainProcessFirstReleasesTheOthersWhenRankZeroThrows) {
  std::atomic<int> ran{0};
  EXPECT_THROW(run_ranks(3,
                         [&](ProcessGroup& pg) {
                           auto accelerator = make_accelerator(pg);
                           accelerator->main_process_first([&] {
                             if (pg.rank() == 0) throw std::runtime_error("download failed");
                             ++ran;
                           });
                         },
                         [] {
                           ProcessGroupOptions o;
                           o.timeout = std::chrono::seconds(20);
                           return o;
                         }()),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 2) << "the other ranks must not wait out the timeout";
}

TEST(AcceleratorHelpers, ChangingTheEpochInsideALoopIsAnErrorNotASilentRestart) {
  run_ranks(1, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    auto loader = accelerator->prepare_data_loader({torch::arange(8, torch::kLong)}, 2);
    auto loop = [&] {
      for (auto& batch : *loader) {
        (void)batch;
        loader->set_epoch(3);
      }
    };
    EXPECT_THROW(loop(), UsageError);
  });
}

TEST(AcceleratorHelpers, EpochAdvancesByItselfAfterAFullPass) {
  run_ranks(1, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    auto loader = accelerator->prepare_data_loader({torch::arange(16, torch::kLong)}, 16);
    auto first = (*loader->begin())[0].clone();
    for (auto& batch : *loader) (void)batch;  // pass 1 (epoch 0 again: begin() restarted it)
    EXPECT_EQ(loader->epoch(), 0);
    std::vector<torch::Tensor> second;
    for (auto& batch : *loader) second.push_back(batch[0].clone());  // epoch 1
    EXPECT_EQ(loader->epoch(), 1);
    EXPECT_FALSE(torch::equal(first, second.at(0))) << "epoch 1 must reshuffle";
  });
}

TEST(AcceleratorHelpers, MainProcessFirstRunsRankZeroBeforeTheOthers) {
  std::mutex mutex;
  std::vector<int> order;
  run_ranks(4, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    accelerator->main_process_first([&] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(pg.rank());
    });
  });
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order.front(), 0);
}

TEST(AcceleratorHelpers, ProcessIndicesComeFromTheGroup) {
  run_ranks(3, [&](ProcessGroup& pg) {
    LauncherEnv launcher;
    launcher.local_rank = pg.rank() % 2;
    launcher.local_world_size = 2;
    Accelerator accelerator(pg.shared_from_this(), Config{}, {}, launcher);
    EXPECT_EQ(accelerator.process_index(), pg.rank());
    EXPECT_EQ(accelerator.num_processes(), 3);
    EXPECT_EQ(accelerator.is_main_process(), pg.rank() == 0);
    EXPECT_EQ(accelerator.is_local_main_process(), pg.rank() % 2 == 0);
    EXPECT_TRUE(accelerator.device().is_cpu());
  });
}

TEST(AcceleratorHelpers, StateDictHasNoWrapperPrefix) {
  run_ranks(2, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    auto model = torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
    accelerator->prepare_model(model);
    std::vector<std::string> keys;
    for (const auto& [key, value] : accelerator->get_state_dict()) {
      keys.push_back(key);
      EXPECT_TRUE(value.is_cpu());
    }
    EXPECT_EQ(keys, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias",
                                              "1.running_mean", "1.running_var",
                                              "1.num_batches_tracked"}));
    EXPECT_EQ(accelerator->unwrap_model().get(), model.ptr().get());
  });
}

TEST(AcceleratorHelpers, SetSeedIsReproducibleAndDeviceSpecificSeedsDiffer) {
  std::mutex mutex;
  std::map<int, std::vector<float>> draws;
  run_ranks(2, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    // Threads share torch's default generator, so draw under one lock.
    std::lock_guard<std::mutex> lock(mutex);
    accelerator->set_seed(42, /*device_specific=*/true);
    auto a = torch::rand({4});
    draws[pg.rank()] = std::vector<float>(a.data_ptr<float>(), a.data_ptr<float>() + 4);
  });
  torch::manual_seed(42);
  auto rank0 = torch::rand({4});
  torch::manual_seed(43);
  auto rank1 = torch::rand({4});
  EXPECT_EQ(draws[0], std::vector<float>(rank0.data_ptr<float>(), rank0.data_ptr<float>() + 4));
  EXPECT_EQ(draws[1], std::vector<float>(rank1.data_ptr<float>(), rank1.data_ptr<float>() + 4));
}

TEST(AcceleratorHelpers, MetricsAreJsonLinesWrittenByTheMainProcessOnly) {
  const testing::ScratchDir scratch;  // unique, and removed afterwards
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.path();
  std::atomic<int> opened{0};
  run_ranks(2, [&](ProcessGroup& pg) {
    auto accelerator = make_accelerator(pg);
    const std::string path = dir + "/rank" + std::to_string(pg.rank()) + "/metrics.jsonl";
    accelerator->init_trackers(path);
    accelerator->log({{"loss", 0.5}, {"tokens_per_s", 1000}}, 1);
    accelerator->log({{"loss", 0.25}, {"nan", std::nan("")}}, 2);
    accelerator->end_training();
    if (std::ifstream(path).good()) ++opened;
  });
  EXPECT_EQ(opened.load(), 1);
  std::ifstream in(dir + "/rank0/metrics.jsonl");
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["step"], 1);
  EXPECT_EQ(rows[0]["loss"], 0.5);
  EXPECT_EQ(rows[1]["loss"], 0.25);
  EXPECT_TRUE(rows[1]["nan"].is_null());
  EXPECT_TRUE(rows[1].contains("time"));
}

TEST(AcceleratorHelpers, DisabledProgressBarCountsNothingAndPrintsNothing) {
  ProgressBar off(10, "train", false);
  off.update(3, "loss 1");
  EXPECT_EQ(off.count(), 0);
  ProgressBar on(10, "train", true);
  on.update(3);
  EXPECT_EQ(on.count(), 3);
}

}  // namespace
}  // namespace tandem
