// Specification of per-sample loading with a collate (collate_fetch,
// PadCollate, stack_collate) and of length bucketing
// (DistributedLoaderOptions::sample_lengths).

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include "support/loader_testing.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/core/error.h"
#include "tandem/data/collate.h"
#include "tandem/data/distributed_loader.h"
#include "tandem/data/distributed_sampler.h"

namespace tandem {
namespace {

using testing::values;

// Sample i: tokens {i, i, ...} of length lengths[i] (int64), label i % 5.
Sample token_sample(const std::vector<int64_t>& lengths, int64_t i) {
  return {at::full({lengths[static_cast<size_t>(i)]}, i, at::kLong),
          at::scalar_tensor(i % 5, at::kLong)};
}

// Lengths 1..13 in a scrambled but fixed pattern.
std::vector<int64_t> scrambled_lengths(int64_t n) {
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < n; ++i) lengths.push_back(1 + (i * 7 + i / 3) % 13);
  return lengths;
}

TEST(PadCollate, PadsToTheBatchsLongestAndMasksThePadding) {
  const std::vector<Sample> samples = {
      {at::tensor({1, 2, 3}, at::kLong), at::scalar_tensor(7, at::kLong)},
      {at::tensor({4}, at::kLong), at::scalar_tensor(8, at::kLong)},
      {at::tensor({5, 6}, at::kLong), at::scalar_tensor(9, at::kLong)}};
  PadCollate collate;
  collate.padding_value = -1;
  collate.lengths = true;
  const auto batch = collate(samples);
  ASSERT_EQ(batch.size(), 4u);  // tokens, labels, mask, lengths
  EXPECT_TRUE(batch[0].equal(at::tensor({1, 2, 3, 4, -1, -1, 5, 6, -1}, at::kLong).view({3, 3})));
  EXPECT_TRUE(batch[1].equal(at::tensor({7, 8, 9}, at::kLong)));
  EXPECT_EQ(batch[2].scalar_type(), at::kBool);
  EXPECT_TRUE(batch[2].equal(
      at::tensor({1, 1, 1, 1, 0, 0, 1, 1, 0}, at::kLong).view({3, 3}).to(at::kBool)));
  EXPECT_TRUE(batch[3].equal(at::tensor({3, 1, 2}, at::kLong)));
}

TEST(PadCollate, PadsTrailingDimensionsAlongDimZeroOnly) {
  const std::vector<Sample> samples = {{at::ones({2, 4})}, {at::ones({5, 4})}};
  const auto batch = PadCollate{}(samples);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].sizes(), (std::vector<int64_t>{2, 5, 4}));
  EXPECT_EQ(batch[0].sum().item<double>(), 28.0);
  EXPECT_EQ(batch[1].sum(1).to(at::kLong).equal(at::tensor({2, 5}, at::kLong)), true);
}

TEST(PadCollate, RejectsSamplesThatCannotBePaddedTogether) {
  PadCollate collate;
  EXPECT_THROW(collate({}), UsageError);
  EXPECT_THROW(collate({{at::ones({2})}, {at::ones({2}), at::ones({1})}}), UsageError);
  EXPECT_THROW(collate({{at::ones({2, 3})}, {at::ones({2, 4})}}), UsageError);
  EXPECT_THROW(collate({{at::ones({2})}, {at::ones({2}, at::kLong)}}), UsageError);
  collate.mask_field = 1;
  EXPECT_THROW(collate({{at::ones({2}), at::scalar_tensor(1)}}), UsageError);
  EXPECT_THROW(stack_collate({{at::ones({2})}, {at::ones({3})}}), UsageError);
  // An undefined field is named as such, not as a tensor of shape [0].
  const std::string undefined = testing::usage_error_message(
      [] { stack_collate({{at::ones({2})}, {at::Tensor()}}); });
  EXPECT_NE(undefined.find("field 0 of sample 1 is undefined"), std::string::npos) << undefined;
}

TEST(CollateFetch, LoaderWithWorkersPadsEachBatchToItsOwnLongest) {
  const int64_t n = 41;
  const auto lengths = scrambled_lengths(n);
  auto fetch = collate_fetch([&lengths](int64_t i) { return token_sample(lengths, i); },
                             PadCollate{});
  for (int64_t workers : {0, 2}) {
    DistributedLoaderOptions options;
    options.batch_size = 4;
    options.num_workers = workers;
    DistributedLoader loader(fetch, n, 3, 2, options);
    loader.set_epoch(1);
    const auto chunks = testing::chunks(loader.epoch_indices(), 4);
    size_t b = 0;
    for (auto& batch : loader) {
      const auto& idx = chunks.at(b++);
      int64_t longest = 0;
      for (int64_t i : idx) longest = std::max(longest, lengths[static_cast<size_t>(i)]);
      ASSERT_EQ(batch.size(), 3u);
      const auto rows = static_cast<int64_t>(idx.size());
      EXPECT_EQ(batch[0].sizes(), (std::vector<int64_t>{rows, longest}));
      // Row r holds sample idx[r] (its value) on exactly its length.
      EXPECT_TRUE(batch[0].select(1, 0).equal(at::tensor(idx, at::kLong)));
      EXPECT_EQ(batch[2].sum().item<int64_t>(), [&] {
        int64_t total = 0;
        for (int64_t i : idx) total += lengths[static_cast<size_t>(i)];
        return total;
      }());
    }
    EXPECT_EQ(b, chunks.size());
  }
}

// Bucketing's contract, checked against its definition from the public
// seeded_randperm: every global batch (the same batch index on all ranks)
// is one run of consecutive entries of one pool sorted by length.
TEST(LengthBucketing, EveryGlobalBatchIsARunOfOneLengthSortedPool) {
  const int64_t n = 103;
  const auto lengths = scrambled_lengths(n);
  for (int64_t world : {1, 2, 3}) {
    for (bool shuffle : {false, true}) {
      const int64_t b = 4;
      const int64_t pool_batches = 3;
      const int64_t epoch = 5;
      const uint64_t seed = 17;
      std::vector<std::vector<int64_t>> per_rank;
      for (int64_t r = 0; r < world; ++r) {
        DistributedSampler sampler(n, world, r, shuffle, seed);
        sampler.bucket_by_length(lengths, b, pool_batches);
        sampler.set_epoch(epoch);
        per_rank.push_back(sampler.indices());
      }
      // The epoch's order before bucketing, and the pool of each sample.
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
      if (shuffle) order = seeded_randperm(n, seed + epoch);
      const int64_t pool = world * b * pool_batches;
      std::map<int64_t, int64_t> pool_of;
      for (int64_t p = 0; p < n; ++p) pool_of[order[static_cast<size_t>(p)]] = p / pool;
      const size_t per = per_rank[0].size();
      const int64_t real_global = n;  // padded entries are the first samples again
      int64_t position = 0;
      const auto ub = static_cast<size_t>(b);
      for (size_t k = 0; k * ub < per; ++k) {
        std::vector<int64_t> global;
        for (int64_t r = 0; r < world; ++r) {
          for (size_t j = k * ub; j < std::min(per, (k + 1) * ub); ++j) {
            if (static_cast<int64_t>(j) * world + r < real_global) {
              global.push_back(per_rank[static_cast<size_t>(r)][j]);
            }
          }
        }
        position += static_cast<int64_t>(global.size());
        SCOPED_TRACE("world=" + std::to_string(world) + " shuffle=" + std::to_string(shuffle) +
                     " batch=" + std::to_string(k));
        const int64_t p = pool_of.at(global.front());
        int64_t lo = 1 << 30;
        int64_t hi = -1;
        std::set<int64_t> members(global.begin(), global.end());
        for (int64_t i : global) {
          EXPECT_EQ(pool_of.at(i), p) << "sample " << i << " is from another pool";
          lo = std::min(lo, lengths[static_cast<size_t>(i)]);
          hi = std::max(hi, lengths[static_cast<size_t>(i)]);
        }
        // No other sample of the pool lies strictly between the batch's
        // shortest and longest: the batch is a run of the sorted pool.
        for (const auto& [i, q] : pool_of) {
          if (q != p || members.count(i)) continue;
          const int64_t l = lengths[static_cast<size_t>(i)];
          EXPECT_FALSE(l > lo && l < hi) << "sample " << i << " (length " << l << ") is missing";
        }
      }
      EXPECT_EQ(position, n);
    }
  }
}

TEST(LengthBucketing, RanksStillSplitEachEpochDisjointlyAndEpochsDiffer) {
  const int64_t n = 50;
  const auto lengths = scrambled_lengths(n);
  for (int64_t world : {2, 3}) {
    std::vector<std::vector<int64_t>> epochs;
    for (int64_t epoch : {0, 1}) {
      std::multiset<int64_t> seen;
      std::vector<int64_t> all;
      for (int64_t r = 0; r < world; ++r) {
        DistributedLoaderOptions options;
        options.batch_size = 3;
        options.even_batches = false;  // exactly one copy of every sample
        options.sample_lengths = lengths;
        options.bucket_pool_batches = 2;
        options.num_workers = r == 1 ? 2 : 0;
        DistributedLoader loader(
            collate_fetch([&lengths](int64_t i) { return token_sample(lengths, i); },
                          PadCollate{}),
            n, world, r, options);
        loader.set_epoch(epoch);
        for (auto& batch : loader) {
          for (int64_t i : values(batch[0].select(1, 0))) {
            seen.insert(i);
            all.push_back(i);
          }
        }
      }
      EXPECT_EQ(seen.size(), static_cast<size_t>(n));
      EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), static_cast<size_t>(n));
      epochs.push_back(all);
    }
    EXPECT_NE(epochs[0], epochs[1]) << "each epoch draws a new order";
  }
}

TEST(LengthBucketing, BucketingCutsPaddingAgainstPlainShuffling) {
  const int64_t n = 400;
  const auto lengths = scrambled_lengths(n);
  auto padded_tokens = [&](bool bucket) {
    DistributedSampler sampler(n, 2, 0, true, 3);
    if (bucket) sampler.bucket_by_length(lengths, 8, 10);
    const auto idx = sampler.indices();
    int64_t total = 0;
    for (const auto& chunk : testing::chunks(idx, 8)) {
      int64_t longest = 0;
      for (int64_t i : chunk) longest = std::max(longest, lengths[static_cast<size_t>(i)]);
      total += longest * static_cast<int64_t>(chunk.size());
    }
    return total;
  };
  EXPECT_LT(padded_tokens(true) * 10, padded_tokens(false) * 8);  // at least 20% fewer
}

TEST(LengthBucketing, BadLengthsAndDisagreeingRanksAreRejected) {
  DistributedSampler sampler(10, 2, 0);
  EXPECT_THROW(sampler.bucket_by_length(std::vector<int64_t>(9, 1), 2, 1), UsageError);
  EXPECT_THROW(sampler.bucket_by_length({1, 2, 3, 4, 5, 6, 7, 8, 9, -1}, 2, 1), UsageError);
  EXPECT_THROW(sampler.bucket_by_length(std::vector<int64_t>(10, 1), 0, 1), UsageError);
  DistributedLoaderOptions options;
  options.sample_lengths = {1, 2, 3};
  EXPECT_THROW(DistributedLoader({at::arange(4)}, 1, 0, options), UsageError);

  std::string message;
  try {
    testing::run_ranks(3, [](ProcessGroup& pg) {
      DistributedLoaderOptions o;
      o.batch_size = 2;
      o.sample_lengths = scrambled_lengths(20);
      if (pg.rank() == 2) o.sample_lengths[4] += 1;  // rank 2 measured differently
      DistributedLoader loader({at::arange(20)}, pg, o);
    });
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("length bucketing"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
