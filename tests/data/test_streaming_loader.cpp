// Specification of StreamingLoader: sharding across ranks and workers with
// no sample duplicated or lost, a deterministic order, exact resume by
// count, drop_last per shard, errors that name the shard, and even batches
// over a process group.

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include "support/loader_testing.h"
#include "support/thread_ranks.h"
#include "tandem/core/error.h"
#include "tandem/data/streaming_loader.h"

namespace tandem {
namespace {

using testing::values;
using Batches = std::vector<std::vector<int64_t>>;

// A stream of samples {i} for i in [begin, end).
SampleStream range_stream(int64_t begin, int64_t end) {
  return [i = begin, end]() mutable -> std::optional<Sample> {
    if (i >= end) return std::nullopt;
    return Sample{at::scalar_tensor(i++, at::kLong)};
  };
}

// Every shard reads all of [0, n) and keeps its own items.
StreamFactory filtered_range(int64_t n) {
  return [n](const StreamShard& shard, int64_t) { return shard_stream(range_stream(0, n), shard); };
}

// "Files" of the given sizes, numbered consecutively; shard s reads files
// f with f % S == s, so the split happens at the source.
StreamFactory sharded_files(std::vector<int64_t> sizes) {
  return [sizes](const StreamShard& shard, int64_t) -> SampleStream {
    std::vector<std::pair<int64_t, int64_t>> mine;
    int64_t begin = 0;
    for (size_t f = 0; f < sizes.size(); ++f) {
      if (static_cast<int64_t>(f) % shard.count() == shard.index()) {
        mine.emplace_back(begin, begin + sizes[f]);
      }
      begin += sizes[f];
    }
    return [mine, file = size_t{0}, i = int64_t{-1}]() mutable -> std::optional<Sample> {
      for (; file < mine.size(); ++file, i = -1) {
        if (i < 0) i = mine[file].first;
        if (i < mine[file].second) return Sample{at::scalar_tensor(i++, at::kLong)};
      }
      return std::nullopt;
    };
  };
}

StreamingLoaderOptions with(int64_t batch_size, int64_t workers, bool drop_last = false) {
  StreamingLoaderOptions options;
  options.batch_size = batch_size;
  options.num_workers = workers;
  options.drop_last = drop_last;
  return options;
}

Batches drain(StreamingLoader& loader) {
  Batches out;
  for (auto& batch : loader) out.push_back(values(batch.at(0)));
  return out;
}

std::vector<int64_t> flat(const Batches& batches) {
  std::vector<int64_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(StreamingLoader, RanksAndWorkersTogetherSeeEverySampleExactlyOnce) {
  const std::vector<int64_t> file_sizes = {5, 0, 9, 1, 13, 2, 7};  // 37 samples
  for (int64_t world : {1, 2, 3}) {
    for (int64_t workers : {0, 1, 2, 3}) {
      for (int64_t batch : {1, 4}) {
        for (int64_t n : {0, 1, 7, 53}) {
          SCOPED_TRACE("world=" + std::to_string(world) + " workers=" +
                       std::to_string(workers) + " batch=" + std::to_string(batch) +
                       " n=" + std::to_string(n));
          std::vector<int64_t> seen;
          std::vector<int64_t> seen_files;
          for (int64_t r = 0; r < world; ++r) {
            StreamingLoader ranged(filtered_range(n), world, r, with(batch, workers));
            const auto got = flat(drain(ranged));
            seen.insert(seen.end(), got.begin(), got.end());
            StreamingLoader files(sharded_files(file_sizes), world, r, with(batch, workers));
            const auto got_files = flat(drain(files));
            seen_files.insert(seen_files.end(), got_files.begin(), got_files.end());
          }
          std::sort(seen.begin(), seen.end());
          std::vector<int64_t> expected(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
          EXPECT_EQ(seen, expected);
          std::sort(seen_files.begin(), seen_files.end());
          std::vector<int64_t> all_files(37);
          for (int64_t i = 0; i < 37; ++i) all_files[static_cast<size_t>(i)] = i;
          EXPECT_EQ(seen_files, all_files);
        }
      }
    }
  }
}

TEST(StreamingLoader, WorkersTakeTurnsAndTheOrderNeverDependsOnTiming) {
  // Two workers on one rank: shard 0 holds the 11 even items of 0..20,
  // shard 1 the 10 odd ones; batches of 3 alternate between them.
  StreamingLoader loader(filtered_range(21), 1, 0, with(3, 2));
  const Batches expected = {{0, 2, 4},    {1, 3, 5},    {6, 8, 10}, {7, 9, 11},
                            {12, 14, 16}, {13, 15, 17}, {18, 20},   {19}};
  for (int pass = 0; pass < 5; ++pass) EXPECT_EQ(drain(loader), expected) << "pass " << pass;
  // Without workers the rank's one shard is read in stream order.
  StreamingLoader inline_reader(filtered_range(7), 1, 0, with(3, 0));
  EXPECT_EQ(drain(inline_reader), (Batches{{0, 1, 2}, {3, 4, 5}, {6}}));
}

TEST(StreamingLoader, SkipFirstBatchesResumesExactlyForAnyWorkerCount) {
  for (int64_t workers : {0, 1, 3}) {
    StreamingLoader loader(sharded_files({4, 6, 3, 8, 1, 5, 2}), 2, 1, with(2, workers));
    loader.set_epoch(4);
    const Batches full = drain(loader);
    ASSERT_GE(full.size(), 5u);
    for (size_t k : {size_t{0}, size_t{1}, size_t{3}, full.size(), full.size() + 2}) {
      SCOPED_TRACE("workers=" + std::to_string(workers) + " k=" + std::to_string(k));
      loader.skip_first_batches(static_cast<int64_t>(k));
      const auto from = full.begin() + static_cast<std::ptrdiff_t>(std::min(k, full.size()));
      EXPECT_EQ(drain(loader), Batches(from, full.end()));
    }
  }
}

TEST(StreamingLoader, DropLastDropsEachShardsShortBatchOnly) {
  // 2 shards (1 rank, 2 workers) of 11 and 10 items, batches of 4.
  StreamingLoader loader(filtered_range(21), 1, 0, with(4, 2, true));
  const Batches got = drain(loader);
  ASSERT_EQ(got.size(), 4u);
  for (const auto& b : got) EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(flat(got).size(), 16u);
}

TEST(StreamingLoader, AStreamErrorNamesTheShardAndEndsThePass) {
  for (int64_t workers : {0, 2}) {
    std::atomic<bool> fail{true};
    StreamFactory factory = [&fail](const StreamShard& shard, int64_t) -> SampleStream {
      SampleStream inner = shard_stream(range_stream(0, 40), shard);
      return [inner, &fail]() mutable -> std::optional<Sample> {
        auto s = inner();
        if (fail && s && s->at(0).item<int64_t>() == 17) throw std::runtime_error("bad record 17");
        return s;
      };
    };
    StreamingLoader loader(factory, 1, 0, with(2, workers));
    std::string message;
    int64_t good = 0;
    try {
      while (loader.next()) ++good;
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("bad record 17"), std::string::npos) << message;
    EXPECT_NE(message.find(workers ? "worker 1 (shard 1 of 2)" : "shard 0 of 1"),
              std::string::npos)
        << message;
    EXPECT_GT(good, 0);
    fail = false;
    EXPECT_EQ(flat(drain(loader)).size(), 40u) << "a new pass reads everything again";
  }
}

TEST(StreamingLoader, EvenBatchesOverAGroupPadShortRanksAndKeepCollectivesMatched) {
  // Batches of 2 over files assigned round-robin to 3 ranks (no workers):
  // rank 0: files 0, 3 (4 + 6 items: 5 batches), rank 1: file 1 (3: 2
  // batches), rank 2: files 2, 5 (2 + 3: 3 batches).
  const std::vector<int64_t> sizes = {4, 3, 2, 6, 0, 3};
  std::vector<std::vector<int64_t>> real(3);
  testing::run_ranks(3, [&](ProcessGroup& pg) {
    StreamingLoader loader(sharded_files(sizes), pg, with(2, pg.rank() == 1 ? 1 : 0));
    for (int pass = 0; pass < 2; ++pass) {
      int64_t steps = 0;
      std::vector<int64_t> mine;
      for (auto& batch : loader) {
        // A collective per batch: it would time out if the ranks' batch
        // counts differed.
        at::Tensor one = at::ones({1});
        pg.all_reduce(one);
        EXPECT_EQ(one.item<float>(), 3.0f);
        if (!loader.padding()) {
          const auto v = values(batch[0]);
          mine.insert(mine.end(), v.begin(), v.end());
        }
        ++steps;
      }
      EXPECT_EQ(steps, 5) << "rank " << pg.rank();
      if (pass == 0) real[static_cast<size_t>(pg.rank())] = mine;
    }
    // Resuming past a short rank's data still pads it with its last batch.
    loader.skip_first_batches(3);
    int64_t rest = 0;
    while (loader.next()) ++rest;
    EXPECT_EQ(rest, 2);
  });
  std::vector<int64_t> all;
  for (const auto& r : real) all.insert(all.end(), r.begin(), r.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(18);
  for (int64_t i = 0; i < 18; ++i) expected[static_cast<size_t>(i)] = i;
  EXPECT_EQ(all, expected) << "real batches hold every sample exactly once";
}

TEST(StreamingLoader, RanksThatDisagreeOnWorkersAreRejected) {
  std::string message;
  try {
    testing::run_ranks(3, [](ProcessGroup& pg) {
      StreamingLoader loader(filtered_range(10), pg, with(2, pg.rank() == 1 ? 2 : 0));
    });
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("same num_workers"), std::string::npos) << message;
  EXPECT_THROW(StreamingLoader(filtered_range(3), 2, 2), UsageError);
  EXPECT_THROW(StreamingLoader(filtered_range(3), 1, 0, with(0, 0)), UsageError);
  EXPECT_THROW(StreamingLoader(nullptr, 1, 0), UsageError);
}

}  // namespace
}  // namespace tandem
