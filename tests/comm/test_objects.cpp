// gather_object / broadcast_object on ranks-as-threads, and
// split_between_processes, checked against values each rank can compute.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <numeric>

#include "support/thread_ranks.h"
#include "tandem/comm/objects.h"
#include "tandem/comm/split.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;

// Rank r's string: empty on rank 0, r * 1000 + 1 bytes of a rank-specific
// pattern (with NUL bytes) elsewhere; rank 1 sends 3 MiB.
std::string rank_string(int rank) {
  const size_t length = rank == 0 ? 0 : rank == 1 ? (3u << 20) : rank * 1000u + 1;
  std::string s(length, '\0');
  for (size_t i = 0; i < length; ++i) s[i] = static_cast<char>((i * 31 + rank) % 256);
  return s;
}

nlohmann::json rank_json(int rank) {
  nlohmann::json j = {{"rank", rank},
                      {"name", std::string(static_cast<size_t>(rank) * 5, 'x')},
                      {"loss", 0.25 + rank / 3.0},
                      {"tags", nlohmann::json::array()}};
  for (int i = 0; i < rank; ++i) j["tags"].push_back({{"i", i}, {"big", 1ull << 60}});
  if (rank == 2) j = nlohmann::json(nullptr);
  return j;
}

// Rank r's tensor: shape {r, 3} (rank 0 empty), a dtype per rank, values
// from the rank; a 0-d tensor on rank 3.
at::Tensor rank_tensor(int rank) {
  const at::ScalarType dtypes[] = {at::kFloat, at::kLong, at::kBFloat16, at::kDouble, at::kBool};
  const auto dtype = dtypes[rank % 5];
  if (rank == 3) return at::scalar_tensor(rank + 0.5, at::kDouble);
  return at::arange(rank * 3, at::kLong).add(rank * 100).reshape({rank, 3}).to(dtype);
}

class ObjectsByWorld : public ::testing::TestWithParam<int> {};

TEST_P(ObjectsByWorld, GatherObjectGivesEveryRankEachRanksString) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    auto all = gather_object(pg, rank_string(pg.rank()));
    ASSERT_EQ(static_cast<int>(all.size()), world);
    for (int r = 0; r < world; ++r) EXPECT_EQ(all[r], rank_string(r)) << "entry " << r;
    auto literal = gather_object(pg, "same");
    EXPECT_EQ(literal, std::vector<std::string>(static_cast<size_t>(world), "same"));
  });
}

TEST_P(ObjectsByWorld, GatherObjectRoundTripsJsonValuesOfEveryKind) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    auto all = gather_object(pg, rank_json(pg.rank()));
    ASSERT_EQ(static_cast<int>(all.size()), world);
    for (int r = 0; r < world; ++r) EXPECT_EQ(all[r], rank_json(r)) << "entry " << r;
  });
}

TEST_P(ObjectsByWorld, GatherObjectKeepsEachRanksTensorShapeDtypeAndValues) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    // A transposed view: the values, not the strides, travel.
    at::Tensor mine = rank_tensor(pg.rank());
    if (mine.dim() == 2) mine = mine.t().contiguous().t();
    auto all = gather_object(pg, mine);
    ASSERT_EQ(static_cast<int>(all.size()), world);
    for (int r = 0; r < world; ++r) {
      const at::Tensor want = rank_tensor(r);
      EXPECT_EQ(all[r].sizes(), want.sizes()) << "entry " << r;
      EXPECT_EQ(all[r].scalar_type(), want.scalar_type()) << "entry " << r;
      EXPECT_TRUE(at::equal(all[r], want)) << "entry " << r;
    }
  });
}

TEST_P(ObjectsByWorld, BroadcastObjectCopiesSrcsObjectToEveryRank) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    for (int src : {0, world - 1}) {
      std::string text = rank_string(pg.rank());
      broadcast_object(pg, text, src);
      EXPECT_EQ(text, rank_string(src));
      nlohmann::json j = rank_json(pg.rank());
      broadcast_object(pg, j, src);
      EXPECT_EQ(j, rank_json(src));
      at::Tensor t = rank_tensor(pg.rank());
      broadcast_object(pg, t, src);
      EXPECT_EQ(t.scalar_type(), rank_tensor(src).scalar_type());
      EXPECT_TRUE(at::equal(t, rank_tensor(src)));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, ObjectsByWorld, ::testing::Values(1, 2, 3));

TEST(Objects, BroadcastObjectFromARankOutsideTheGroupIsAUsageError) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::string text = "x";
    EXPECT_THROW(broadcast_object(pg, text, 2), UsageError);
    EXPECT_THROW(broadcast_object(pg, text, -1), UsageError);
  });
}

TEST(Objects, UndefinedAndSparseTensorsAreUsageErrors) {
  auto pg = ProcessGroup::local();
  EXPECT_THROW(gather_object(*pg, at::Tensor()), UsageError);
  EXPECT_THROW(gather_object(*pg, at::ones({2, 2}).to_sparse()), UsageError);
}

// ---- split_between_processes ---------------------------------------------

TEST(SplitBetweenProcesses, SlicesAreContiguousBalancedAndEarlierRanksGetTheExtra) {
  for (int world = 1; world <= 4; ++world) {
    for (int n = 0; n <= 11; ++n) {
      std::vector<int> items(static_cast<size_t>(n));
      std::iota(items.begin(), items.end(), 100);
      std::vector<int> joined;
      for (int rank = 0; rank < world; ++rank) {
        auto mine = split_between_processes(items, rank, world);
        const int want = n / world + (rank < n % world ? 1 : 0);
        EXPECT_EQ(static_cast<int>(mine.size()), want) << "n=" << n << " world=" << world;
        joined.insert(joined.end(), mine.begin(), mine.end());
      }
      EXPECT_EQ(joined, items) << "n=" << n << " world=" << world;
    }
  }
}

TEST(SplitBetweenProcesses, PaddingRepeatsTheLastItemUpToEqualSizes) {
  const std::vector<std::string> items = {"a", "b", "c", "d", "e"};
  using V = std::vector<std::string>;
  EXPECT_EQ(split_between_processes(items, 0, 3, true), (V{"a", "b"}));
  EXPECT_EQ(split_between_processes(items, 1, 3, true), (V{"c", "d"}));
  EXPECT_EQ(split_between_processes(items, 2, 3, true), (V{"e", "e"}));
  // Fewer items than ranks: the empty ranks get the last item.
  EXPECT_EQ(split_between_processes(V{"a", "b"}, 2, 3, true), (V{"b"}));
  EXPECT_EQ(split_between_processes(V{"a", "b"}, 2, 3, false), V{});
  // An even split needs no padding; world 1 returns the input as it is.
  EXPECT_EQ(split_between_processes(items, 4, 5, true), (V{"e"}));
  EXPECT_EQ(split_between_processes(items, 0, 1, true), items);
}

TEST(SplitBetweenProcesses, TensorRowsSplitLikeAList) {
  const at::Tensor items = at::arange(7 * 2, at::kFloat).reshape({7, 2});
  std::vector<int64_t> rows(7);
  std::iota(rows.begin(), rows.end(), 0);
  for (int world = 1; world <= 4; ++world) {
    for (bool pad : {false, true}) {
      for (int rank = 0; rank < world; ++rank) {
        auto want_rows = split_between_processes(rows, rank, world, pad);
        auto got = split_between_processes(items, rank, world, pad);
        at::Tensor want = items.index_select(0, at::tensor(want_rows, at::kLong));
        EXPECT_TRUE(at::equal(got, want)) << "world=" << world << " rank=" << rank
                                          << " pad=" << pad;
      }
    }
  }
}

TEST(SplitBetweenProcesses, BadArgumentsAreUsageErrors) {
  const std::vector<int> items = {1, 2, 3};
  EXPECT_THROW(split_between_processes(items, 3, 3), UsageError);
  EXPECT_THROW(split_between_processes(items, -1, 3), UsageError);
  EXPECT_THROW(split_between_processes(items, 0, 0), UsageError);
  EXPECT_THROW(split_between_processes(std::vector<int>{}, 0, 2, true), UsageError);
  EXPECT_THROW(split_between_processes(at::scalar_tensor(1.0), 0, 2), UsageError);
}

}  // namespace
}  // namespace tandem
