// Specification of tandem::DistributedSampler: PyTorch's index order (from
// recorded vectors), argument checks, epochs, and closed-form coverage.

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/thread_ranks.h"
#include "tandem/core/error.h"
#include "tandem/data/distributed_sampler.h"
#include "support/usage_error.h"

using tandem::testing::usage_error_message;

namespace tandem {
namespace {

// Written by tests/data/vectors/record_sampler_vectors.py from PyTorch.
nlohmann::json load_vectors() {
  const std::string path = std::string(TANDEM_TEST_DATA_DIR) + "/distributed_sampler.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

std::string describe(const nlohmann::json& c) {
  return "n=" + c["n"].dump() + " replicas=" + c["replicas"].dump() +
         " shuffle=" + c["shuffle"].dump() + " seed=" + c["seed"].dump() +
         " epoch=" + c["epoch"].dump() + " drop_last=" + c["drop_last"].dump();
}

TEST(DistributedSampler, MatchesPyTorchOnEveryRecordedCase) {
  const auto vectors = load_vectors();
  const auto& cases = vectors.at("sampler_cases");
  ASSERT_GT(cases.size(), 500u);
  for (const auto& c : cases) {
    SCOPED_TRACE(describe(c));
    const int64_t replicas = c["replicas"];
    for (int64_t rank = 0; rank < replicas; ++rank) {
      DistributedSampler sampler(c["n"].get<int64_t>(), replicas, rank, c["shuffle"].get<bool>(),
                                 c["seed"].get<uint64_t>(), c["drop_last"].get<bool>());
      sampler.set_epoch(c["epoch"].get<int64_t>());
      EXPECT_EQ(sampler.num_samples(), c["num_samples"].get<int64_t>());
      EXPECT_EQ(sampler.total_size(), c["total_size"].get<int64_t>());
      ASSERT_EQ(sampler.indices(), c["ranks"][rank].get<std::vector<int64_t>>()) << "rank " << rank;
    }
  }
}

TEST(DistributedSampler, RandpermMatchesPyTorchForSmallAndLargeN) {
  const auto vectors = load_vectors();
  for (const auto& c : vectors.at("randperm_cases")) {
    const int64_t n = c["n"];
    const uint64_t seed = c["seed"];
    SCOPED_TRACE("n=" + std::to_string(n) + " seed=" + std::to_string(seed));
    const std::vector<int64_t> perm = seeded_randperm(n, seed);
    ASSERT_EQ(static_cast<int64_t>(perm.size()), n);
    const auto head = c["head"].get<std::vector<int64_t>>();
    const auto tail = c["tail"].get<std::vector<int64_t>>();
    EXPECT_TRUE(std::equal(head.begin(), head.end(), perm.begin()));
    EXPECT_TRUE(std::equal(tail.rbegin(), tail.rend(), perm.rbegin()));
    // Position-weighted sum mod 2^61 - 1, as in the recording script.
    const uint64_t mod = (uint64_t{1} << 61) - 1;
    uint64_t checksum = 0;
    for (size_t i = 0; i < perm.size(); ++i) {
      checksum = (checksum + (i + 1) * static_cast<uint64_t>(perm[i])) % mod;
    }
    EXPECT_EQ(checksum, c["checksum"].get<uint64_t>());
  }
}

TEST(DistributedSampler, RejectsBadArgumentsWithActionableMessages) {
  EXPECT_NE(usage_error_message([] { DistributedSampler(10, 0, 0); }).find("num_replicas must be >= 1"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { DistributedSampler(10, 4, 4); }).find("rank 4 is outside [0, 4)"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { DistributedSampler(10, 4, -1); }).find("rank -1 is outside"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { DistributedSampler(-1, 4, 0); }).find("dataset_size must be >= 0"),
            std::string::npos);
  EXPECT_NO_THROW(DistributedSampler(0, 4, 3));
}

TEST(DistributedSampler, SetEpochReshufflesOnlyWhenShuffling) {
  DistributedSampler shuffled(100, 2, 1, /*shuffle=*/true, /*seed=*/3);
  const auto epoch0 = shuffled.indices();
  shuffled.set_epoch(1);
  EXPECT_EQ(shuffled.epoch(), 1);
  EXPECT_NE(shuffled.indices(), epoch0);
  shuffled.set_epoch(0);
  EXPECT_EQ(shuffled.indices(), epoch0) << "an epoch's order must be reproducible";

  DistributedSampler ordered(100, 2, 1, /*shuffle=*/false);
  const auto before = ordered.indices();
  ordered.set_epoch(7);
  EXPECT_EQ(ordered.indices(), before);
}

TEST(DistributedSampler, RanksTogetherCoverTheDatasetWithEqualCounts) {
  for (int64_t n : {0, 1, 2, 5, 9, 31, 64}) {
    for (int64_t replicas : {1, 2, 3, 7, 8}) {
      for (bool drop_last : {false, true}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " replicas=" + std::to_string(replicas) +
                     " drop_last=" + std::to_string(drop_last));
        std::map<int64_t, int> seen;
        for (int64_t rank = 0; rank < replicas; ++rank) {
          DistributedSampler sampler(n, replicas, rank, true, 11, drop_last);
          sampler.set_epoch(2);
          const auto indices = sampler.indices();
          ASSERT_EQ(static_cast<int64_t>(indices.size()), sampler.num_samples());
          for (int64_t i : indices) {
            ASSERT_TRUE(i >= 0 && i < n) << i;
            ++seen[i];
          }
        }
        const int64_t per_rank = drop_last ? n / replicas : (n + replicas - 1) / replicas;
        if (drop_last) {
          // Cut, never padded: every sample at most once, only the tail lost.
          EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank * replicas);
          for (const auto& [index, count] : seen) EXPECT_EQ(count, 1) << index;
        } else {
          // Padded by wrap-around: every sample at least once, and the
          // padding repeats samples as evenly as wrap-around allows.
          EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
          const int64_t total = per_rank * replicas;
          for (const auto& [index, count] : seen) {
            EXPECT_GE(count, total / n);
            EXPECT_LE(count, total / n + 1);
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, ProcessGroupConstructorTakesRankAndWorldFromTheGroup) {
  testing::run_ranks(3, [](ProcessGroup& pg) {
    DistributedSampler from_group(pg, 20, true, 5);
    DistributedSampler explicit_args(20, 3, pg.rank(), true, 5);
    EXPECT_EQ(from_group.rank(), pg.rank());
    EXPECT_EQ(from_group.num_replicas(), 3);
    EXPECT_EQ(from_group.indices(), explicit_args.indices());
  });
}

TEST(DistributedSampler, ProcessGroupConstructorRejectsRanksThatDisagree) {
  std::string message;
  try {
    testing::run_ranks(3, [](ProcessGroup& pg) {
      // Rank 2 seeds differently: every rank must notice, none may hang.
      DistributedSampler sampler(pg, 20, true, pg.rank() == 2 ? 6 : 5);
    });
  } catch (const UsageError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("seed="), std::string::npos) << message;
  EXPECT_NE(message.find("Every rank must see the same dataset"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
