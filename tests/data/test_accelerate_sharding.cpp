// DistributedLoaderOptions::Sharding kBatches and kDispatched (a prepared
// loader with split_batches or dispatch_batches): every rank's batches are
// the ones HF Accelerate's prepared loaders give it, index for index, from
// vectors recorded with Accelerate itself
// (tests/data/vectors/record_accelerate_shard_vectors.py), at worlds 1, 2 and 3
// (at 1 Accelerate shards nothing: the plain loader's batches, the last one short).

#include <fstream>
#include <string>
#include <vector>

#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/loader_testing.h"
#include "tandem/core/error.h"
#include "tandem/data/distributed_loader.h"

namespace tandem {
namespace {

using Batches = std::vector<std::vector<int64_t>>;

Batches accelerate_sharded_batches(const nlohmann::json& c, int64_t rank) {
  DistributedLoaderOptions options;
  options.batch_size = c["batch_size"].get<int64_t>();
  options.shuffle = false;
  options.drop_last = c["drop_last"].get<bool>();
  options.even_batches = c["even_batches"].get<bool>();
  options.split_batches = c["split_batches"].get<bool>();
  options.sharding = c["dispatch_batches"].get<bool>()
                         ? DistributedLoaderOptions::Sharding::kDispatched
                         : DistributedLoaderOptions::Sharding::kBatches;
  const int64_t n = c["n"].get<int64_t>();
  DistributedLoader loader({at::arange(n)}, c["world"].get<int64_t>(), rank, options);
  Batches batches = testing::drain(loader);
  EXPECT_EQ(static_cast<int64_t>(batches.size()), loader.size());
  return batches;
}

TEST(AccelerateSharding, EveryRankGetsTheBatchesAcceleratesLoadersGive) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/accelerate_shards.json");
  ASSERT_TRUE(in) << "missing accelerate_shards.json";
  const auto vectors = nlohmann::json::parse(in);
  int compared = 0;
  int worlds_seen[4] = {0, 0, 0, 0};
  for (const auto& c : vectors["cases"]) {
    if (c.contains("error")) continue;  // Accelerate itself fails on it (an empty dispatch)
    const int64_t world = c["world"].get<int64_t>();
    ++worlds_seen[world];
    for (int64_t rank = 0; rank < world; ++rank) {
      Batches expected = c["ranks"][rank].get<Batches>();
      // The one difference: with fewer samples than processes, Accelerate's
      // dispatcher hands the last rank a batch of 0 rows; tandem yields none.
      if (c["n"].get<int64_t>() < world && expected == Batches{{}}) expected.clear();
      EXPECT_EQ(accelerate_sharded_batches(c, rank), expected) << c.dump() << " rank " << rank;
      ++compared;
    }
  }
  EXPECT_GT(worlds_seen[1], 300);
  EXPECT_GT(worlds_seen[2], 300);
  EXPECT_GT(worlds_seen[3], 300);
  EXPECT_GT(compared, 1800);
}

TEST(AccelerateSharding, SplitBatchesNeedsAnAccelerateSharding) {
  DistributedLoaderOptions options;
  options.split_batches = true;
  EXPECT_THROW(DistributedLoader({at::arange(8)}, 2, 0, options), UsageError);
  options.sharding = DistributedLoaderOptions::Sharding::kBatches;
  options.sample_lengths = std::vector<int64_t>(8, 1);
  EXPECT_THROW(DistributedLoader({at::arange(8)}, 2, 0, options), UsageError);
}

}  // namespace
}  // namespace tandem
