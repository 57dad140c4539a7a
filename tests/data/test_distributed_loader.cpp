// Specification of tandem::DistributedLoader's batches: PyTorch DataLoader
// parity (recorded vectors), chunking, drop_last, resuming, equal batch
// counts across ranks, coverage, and argument checks.

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/loader_testing.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/core/error.h"
#include "tandem/data/distributed_loader.h"

using tandem::testing::usage_error_message;

namespace tandem {
namespace {

using testing::chunks;
using testing::drain;
using testing::values;

DistributedLoaderOptions with_batch(int64_t batch_size, bool drop_last = false) {
  DistributedLoaderOptions options;
  options.batch_size = batch_size;
  options.seed = 42;
  options.drop_last = drop_last;
  return options;
}

TEST(DistributedLoader, MatchesPyTorchDataLoaderOnEveryRecordedCase) {
  const std::string path = std::string(TANDEM_TEST_DATA_DIR) + "/distributed_loader.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const auto vectors = nlohmann::json::parse(in);
  const auto& cases = vectors.at("loader_cases");
  ASSERT_GT(cases.size(), 100u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.dump().substr(0, 160));
    const int64_t n = c["n"];
    const int64_t replicas = c["replicas"];
    DistributedLoaderOptions options;
    options.batch_size = c["batch_size"];
    options.shuffle = c["shuffle"];
    options.seed = c["seed"];
    options.sampler_drop_last = c["sampler_drop_last"];
    options.drop_last = c["drop_last"];
    for (int64_t rank = 0; rank < replicas; ++rank) {
      DistributedLoader loader({at::arange(n, at::kLong)}, replicas, rank, options);
      loader.set_epoch(c["epoch"]);
      const auto expected = c["ranks"][rank].get<std::vector<std::vector<int64_t>>>();
      EXPECT_EQ(loader.size(), static_cast<int64_t>(expected.size()));
      ASSERT_EQ(drain(loader), expected) << "rank " << rank;
    }
  }
}

TEST(DistributedLoader, BatchesAreTheSamplersIndexChunksWithFieldsAligned) {
  const at::Tensor inputs = at::arange(23, at::kLong) * 10;
  const at::Tensor labels = at::arange(23, at::kLong);
  DistributedLoader loader({inputs, labels}, 3, 1, with_batch(3));
  loader.set_epoch(4);
  DistributedSampler sampler(23, 3, 1, true, 42);
  sampler.set_epoch(4);
  const auto expected = chunks(sampler.indices(), 3);

  std::vector<std::vector<int64_t>> got;
  for (auto& batch : loader) {
    ASSERT_EQ(batch.size(), 2u);
    EXPECT_TRUE(batch[0].equal(batch[1] * 10)) << "row i of every tensor is sample i";
    got.push_back(values(batch[1]));
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(loader.size(), 3);  // 8 samples on rank 1: 3 + 3 + 2
}

TEST(DistributedLoader, DropLastDropsOnlyTheShortFinalBatch) {
  DistributedLoader keep({at::arange(23, at::kLong)}, 3, 0, with_batch(3));
  DistributedLoader drop({at::arange(23, at::kLong)}, 3, 0, with_batch(3, true));
  const auto kept = drain(keep);
  const auto dropped = drain(drop);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept.back().size(), 2u);
  EXPECT_EQ(drop.size(), 2);
  EXPECT_EQ(dropped, std::vector<std::vector<int64_t>>(kept.begin(), kept.end() - 1));
}

TEST(DistributedLoader, SkipFirstBatchesResumesMidEpochOnceThenResets) {
  DistributedLoader loader({at::arange(50, at::kLong)}, 2, 1, with_batch(4));
  loader.set_epoch(3);
  const auto full = drain(loader);
  ASSERT_EQ(full.size(), 7u);

  // Either order of set_epoch and skip_first_batches resumes the same way.
  loader.skip_first_batches(5);
  loader.set_epoch(3);
  EXPECT_EQ(drain(loader), std::vector<std::vector<int64_t>>(full.begin() + 5, full.end()));
  EXPECT_EQ(drain(loader), full) << "the skip applies to one pass only";

  loader.skip_first_batches(2);
  std::vector<std::vector<int64_t>> resumed;
  while (auto batch = loader.next()) resumed.push_back(values(batch->at(0)));
  EXPECT_EQ(resumed, std::vector<std::vector<int64_t>>(full.begin() + 2, full.end()));

  loader.skip_first_batches(7);
  EXPECT_TRUE(drain(loader).empty()) << "skipping a whole epoch leaves an empty pass";
  loader.skip_first_batches(100);
  EXPECT_TRUE(drain(loader).empty());
  EXPECT_EQ(loader.size(), 7) << "size() is the whole epoch, skip or not";
  EXPECT_THROW(loader.skip_first_batches(-1), UsageError);
}

TEST(DistributedLoader, NextRunsOnePassThenStartsTheNext) {
  DistributedLoader loader({at::arange(10, at::kLong)}, 1, 0, with_batch(4));
  std::vector<std::vector<int64_t>> first;
  while (auto batch = loader.next()) first.push_back(values(batch->at(0)));
  EXPECT_EQ(first.size(), 3u);
  EXPECT_EQ(drain(loader), first) << "a pass without set_epoch repeats the epoch";
  loader.set_epoch(1);
  EXPECT_NE(drain(loader), first);
}

TEST(DistributedLoader, EveryRankYieldsTheSameNumberOfBatches) {
  testing::run_ranks(3, [](ProcessGroup& pg) {
    // 10 samples over 3 ranks: padding gives every rank 4, so 2 batches of 3.
    DistributedLoader loader({at::arange(10, at::kLong)}, pg, with_batch(3));
    int64_t count = 0;
    for (auto& batch : loader) count += batch[0].size(0) > 0;
    EXPECT_EQ(count, loader.size());
    const auto counts = pg.all_gather(at::tensor({count}, at::kLong));
    for (const auto& c : counts) EXPECT_EQ(c.item<int64_t>(), 2);
  });
}

// All ranks' samples of one epoch, with multiplicity.
std::map<int64_t, int> samples_of_epoch(int64_t n, int64_t replicas, int64_t epoch,
                                        DistributedLoaderOptions options) {
  std::map<int64_t, int> seen;
  for (int64_t rank = 0; rank < replicas; ++rank) {
    DistributedLoader loader({at::arange(n, at::kLong)}, replicas, rank, options);
    loader.set_epoch(epoch);
    for (const auto& batch : drain(loader)) {
      for (int64_t i : batch) ++seen[i];
    }
  }
  return seen;
}

TEST(DistributedLoader, RanksTogetherCoverTheDatasetEveryEpoch) {
  for (int64_t epoch : {0, 1, 2}) {
    const auto seen = samples_of_epoch(29, 4, epoch, with_batch(3));
    EXPECT_EQ(seen.size(), 29u);
    int total = 0;
    for (const auto& [index, count] : seen) total += count;
    EXPECT_EQ(total, 32) << "padded to 4 ranks x 8 samples";
  }
}

TEST(DistributedLoader, UnevenBatchesSeeEachSampleOnceAsAPrefixOfEvenOnes) {
  DistributedLoaderOptions uneven = with_batch(3);
  uneven.even_batches = false;
  const auto seen = samples_of_epoch(29, 4, 1, uneven);
  EXPECT_EQ(seen.size(), 29u);
  for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << index;

  // Rank 0 holds positions 0, 4, ..., 28 (8 samples); rank 3 only 7.
  for (int64_t rank : {0, 3}) {
    DistributedLoader even({at::arange(29, at::kLong)}, 4, rank, with_batch(3));
    DistributedLoader odd({at::arange(29, at::kLong)}, 4, rank, uneven);
    EXPECT_EQ(odd.num_samples(), rank == 0 ? 8 : 7);
    const auto full = even.epoch_indices();
    const auto cut = odd.epoch_indices();
    EXPECT_TRUE(std::equal(cut.begin(), cut.end(), full.begin()));
  }
  DistributedLoaderOptions tiny = uneven;
  tiny.batch_size = 1;
  DistributedLoader idle({at::arange(2, at::kLong)}, 4, 3, tiny);
  EXPECT_EQ(idle.size(), 0) << "a rank beyond the dataset gets no batch without padding";
}

TEST(DistributedLoader, RejectsBadInputWithActionableMessages) {
  const auto x = at::zeros({10, 3});
  EXPECT_NE(usage_error_message([&] {
              DistributedLoader({x, at::zeros({9})}, 2, 0);
            }).find("tensor 1 has 9 rows in dim 0 (shape [9]) but tensor 0 has 10"),
            std::string::npos);
  EXPECT_NE(usage_error_message([&] {
              DistributedLoader({x}, 2, 0, with_batch(0));
            }).find("batch_size must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] {
              DistributedLoader(std::vector<at::Tensor>{}, 2, 0);
            }).find("no tensors given"),
            std::string::npos);
  EXPECT_NE(
      usage_error_message([] { DistributedLoader({at::scalar_tensor(1.0)}, 2, 0); }).find("0-dimensional"),
      std::string::npos);
  DistributedLoaderOptions bad_prefetch;
  bad_prefetch.prefetch = -1;
  EXPECT_NE(usage_error_message([&] {
              DistributedLoader({x}, 2, 0, bad_prefetch);
            }).find("prefetch must be >= 0"),
            std::string::npos);
  EXPECT_NE(usage_error_message([&] { DistributedLoader({x}, 2, 2); }).find("rank 2 is outside [0, 2)"),
            std::string::npos);
  if (!at::hasCUDA()) {
    DistributedLoaderOptions on_gpu;
    on_gpu.device = c10::Device(c10::kCUDA, 0);
    EXPECT_NE(usage_error_message([&] { DistributedLoader({x}, 2, 0, on_gpu); }).find("no usable CUDA"),
              std::string::npos);
  }
}

TEST(DistributedLoader, EmptyDatasetYieldsNoBatches) {
  DistributedLoader loader({at::zeros({0, 4})}, 2, 1, with_batch(2));
  EXPECT_EQ(loader.size(), 0);
  EXPECT_TRUE(drain(loader).empty());
  EXPECT_FALSE(loader.next().has_value());
}

}  // namespace
}  // namespace tandem
