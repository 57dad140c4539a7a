// Hierarchical all-reduce, reduce-scatter and all-gather: ranks as threads,
// several hosts played by giving each rank a host_id. Each layout is a string
// with one letter per rank naming its host ("aabb": ranks 0, 1 on host a;
// "abab": interleaved). Results are checked against closed forms, and
// random floats against the flat path (the switch off) within reduction-order
// tolerance.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "comm/hierarchical.h"
#include "comm/shm_transport.h"
#include "support/thread_ranks.h"
#include "tandem/core/error.h"
#include "tandem/core/rank_env.h"

namespace tandem {
namespace {

using testing::run_ranks_with_options;

// Options for rank r of `layout`: its host, the mode, a short timeout.
std::function<ProcessGroupOptions(int)> hosts_of(const std::string& layout,
                                                 Hierarchical mode = Hierarchical::kAuto) {
  return [layout, mode](int rank) {
    ProcessGroupOptions options;
    options.host_id = std::string("host-") + layout[static_cast<std::size_t>(rank)];
    options.hierarchical = mode;
    options.timeout = std::chrono::seconds(30);
    return options;
  };
}

// Whether `layout` should go hierarchical: several hosts, one with several ranks.
bool expect_hierarchical(const std::string& layout) {
  std::map<char, int> count;
  for (char c : layout) ++count[c];
  if (count.size() < 2) return false;
  for (const auto& [host, n] : count) {
    if (n > 1) return true;
  }
  return false;
}

bool equal_hosts(const std::string& layout) {
  std::map<char, int> count;
  for (char c : layout) ++count[c];
  for (const auto& [host, n] : count) {
    if (n != count.begin()->second) return false;
  }
  return true;
}

// Rank r's value at element i: small integers, exact in every dtype tested
// (also bf16 and half) when summed over 5 ranks.
at::Tensor rank_values(int rank, int64_t n, at::ScalarType dtype) {
  auto i = at::arange(n, at::kLong);
  return i.remainder(7).add(1).mul(rank + 1).add(i.remainder(3)).to(dtype);
}

// The closed form of `op` over ranks 0..world-1 of rank_values, in double.
at::Tensor reduced_values(int world, int64_t n, ReduceOp op) {
  auto i = at::arange(n, at::kLong).to(at::kDouble);
  auto base = i.remainder(7).add(1);
  auto offset = i.remainder(3);
  const double ranks_sum = world * (world + 1) / 2.0;
  switch (op) {
    case ReduceOp::kSum: return base.mul(ranks_sum).add(offset.mul(world));
    case ReduceOp::kAvg: return base.mul(ranks_sum / world).add(offset);
    case ReduceOp::kMax: return base.mul(world).add(offset);
    case ReduceOp::kMin: return base.add(offset);
  }
  return {};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  if (got.numel() == 0) return;
  const bool low = got.scalar_type() == at::kHalf || got.scalar_type() == at::kBFloat16;
  EXPECT_TRUE(at::allclose(got.to(at::kDouble).reshape({-1}), want.reshape({-1}),
                           low ? 1e-2 : 1e-6, 0))
      << what << ": got " << got.reshape({-1}).slice(0, 0, 8) << " want "
      << want.reshape({-1}).slice(0, 0, 8);
}

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf,
                                             at::kBFloat16, at::kInt, at::kLong};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                    ReduceOp::kMin};

// ---- every layout -----------------------------------------------------------

class HierarchicalLayouts : public ::testing::TestWithParam<std::string> {};

TEST_P(HierarchicalLayouts, ThePathFollowsTheLayoutAndEveryCollectiveMatchesTheClosedForm) {
  const std::string layout = GetParam();
  const int world = static_cast<int>(layout.size());
  run_ranks_with_options(
      world,
      [&](ProcessGroup& pg) {
        const int r = pg.rank();
        ASSERT_EQ(pg.uses_hierarchical(), expect_hierarchical(layout));
        EXPECT_EQ(pg.sequence_number(), 0u);  // the inner groups were not numbered
        if (pg.uses_hierarchical()) {
          EXPECT_EQ(pg.hierarchical_form(), equal_hosts(layout) ? "split" : "leader");
        }
        for (int64_t n : {0, 1, 7, 1001}) {
          for (auto dtype : kDtypes) {
            for (auto op : kOps) {
              if (op == ReduceOp::kAvg && !at::isFloatingType(dtype)) continue;
              const std::string what = std::string("n=") + std::to_string(n) + " " +
                                       c10::toString(dtype) + " " + to_string(op);
              auto t = rank_values(r, n, dtype);
              pg.all_reduce(t, op);
              expect_close(t, reduced_values(world, n, op), "all_reduce " + what);

              auto whole = rank_values(r, n * world, dtype);
              auto shard = at::empty({n}, dtype);
              pg.reduce_scatter(shard, whole, op);
              expect_close(shard, reduced_values(world, n * world, op).narrow(0, r * n, n),
                           "reduce_scatter " + what);
            }
            auto gathered = pg.all_gather(rank_values(r, n, dtype));
            ASSERT_EQ(static_cast<int>(gathered.size()), world);
            for (int k = 0; k < world; ++k) {
              EXPECT_TRUE(at::equal(gathered[static_cast<std::size_t>(k)], rank_values(k, n, dtype)))
                  << "all_gather n=" << n << " entry " << k;
            }
            auto into = at::full({world, n}, -1, dtype);
            pg.all_gather_into(into, rank_values(r, n, dtype));
            for (int k = 0; k < world; ++k) {
              EXPECT_TRUE(at::equal(into[k], rank_values(k, n, dtype)))
                  << "all_gather_into n=" << n << " entry " << k;
            }
          }
        }
      },
      hosts_of(layout));
}

INSTANTIATE_TEST_SUITE_P(
    HostLayouts, HierarchicalLayouts,
    ::testing::Values("a", "aa", "ab", "aabb", "abc", "aab", "aaabb", "aabbc", "abab", "abba",
                      "ababa", "baa"),
    [](const ::testing::TestParamInfo<std::string>& info) { return "hosts_" + info.param; });

// ---- sizes past the shared-memory chunk -------------------------------------

TEST(Hierarchical, TensorsLargerThanTheSharedMemoryChunkMatchTheClosedForm) {
  // Per rank more than ShmTransport::kChunkBytes, and not a multiple of it.
  const int64_t n = static_cast<int64_t>(detail::ShmTransport::kChunkBytes / sizeof(float)) + 13;
  for (const std::string layout : {"abab", "aab"}) {
    const int world = static_cast<int>(layout.size());
    run_ranks_with_options(
        world,
        [&](ProcessGroup& pg) {
          ASSERT_TRUE(pg.uses_hierarchical());
          auto t = rank_values(pg.rank(), n, at::kFloat);
          pg.all_reduce(t, ReduceOp::kSum);
          expect_close(t, reduced_values(world, n, ReduceOp::kSum), layout + " all_reduce");

          const int64_t part = n / world + 1;
          auto shard = at::empty({part}, at::kFloat);
          pg.reduce_scatter(shard, rank_values(pg.rank(), part * world, at::kFloat),
                            ReduceOp::kMax);
          expect_close(shard,
                       reduced_values(world, part * world, ReduceOp::kMax)
                           .narrow(0, pg.rank() * part, part),
                       layout + " reduce_scatter");

          auto into = at::empty({world * n}, at::kFloat);
          pg.all_gather_into(into, rank_values(pg.rank(), n, at::kFloat));
          for (int k = 0; k < world; ++k) {
            EXPECT_TRUE(at::equal(into.narrow(0, k * n, n), rank_values(k, n, at::kFloat)))
                << layout << " all_gather_into entry " << k;
          }
        },
        hosts_of(layout));
  }
}

// ---- against the flat path --------------------------------------------------

// Every rank's result of all_reduce and reduce_scatter on random floats, with
// the hierarchical mode `mode`.
std::map<int, std::pair<at::Tensor, at::Tensor>> random_results(const std::string& layout,
                                                                 Hierarchical mode) {
  const int world = static_cast<int>(layout.size());
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < world; ++r) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + r);
    inputs.push_back(at::randn({world * 333}, gen, at::kFloat));
  }
  std::mutex mutex;
  std::map<int, std::pair<at::Tensor, at::Tensor>> results;
  run_ranks_with_options(
      world,
      [&](ProcessGroup& pg) {
        EXPECT_EQ(pg.uses_hierarchical(), mode != Hierarchical::kOff);
        auto reduced = inputs[static_cast<std::size_t>(pg.rank())].clone();
        pg.all_reduce(reduced, ReduceOp::kAvg);
        auto shard = at::empty({333}, at::kFloat);
        pg.reduce_scatter(shard, inputs[static_cast<std::size_t>(pg.rank())], ReduceOp::kSum);
        std::lock_guard<std::mutex> lock(mutex);
        results[pg.rank()] = {reduced, shard};
      },
      hosts_of(layout, mode));
  return results;
}

TEST(Hierarchical, RandomFloatsMatchTheFlatPathWithinReductionOrderTolerance) {
  for (auto mode : {Hierarchical::kAuto, Hierarchical::kLeader}) {
    const std::string layout = "ababa";  // hosts of 3 and 2, interleaved
    auto flat = random_results(layout, Hierarchical::kOff);
    auto hier = random_results(layout, mode);
    for (int r = 0; r < 5; ++r) {
      EXPECT_TRUE(at::allclose(hier[r].first, flat[r].first, 1e-5, 1e-6)) << "all_reduce " << r;
      EXPECT_TRUE(at::allclose(hier[r].second, flat[r].second, 1e-5, 1e-6))
          << "reduce_scatter " << r;
    }
  }
}

TEST(Hierarchical, PipelinedSplitAllReduceMatchesTheFlatPathWithinReductionOrderTolerance) {
  // 2.5 pieces of the split form's pipeline per call (the last one short and
  // not divisible by the 2 ranks per host), sum and average, and a bfloat16
  // call that reduces an fp32 copy.
  const int64_t piece = detail::Hierarchy::kPipelinePieceBytes / static_cast<int64_t>(sizeof(float));
  const int64_t n = 2 * piece + piece / 2 + 7;
  const std::string layout = "abab";
  const int world = static_cast<int>(layout.size());
  const auto input = [&](int rank, at::ScalarType dtype) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(2000 + rank);
    return at::randn({n}, gen, at::kFloat).to(dtype);
  };
  std::mutex mutex;
  std::map<std::pair<int, bool>, std::vector<at::Tensor>> results;  // (rank, hierarchical)
  for (auto mode : {Hierarchical::kOff, Hierarchical::kSplit}) {
    run_ranks_with_options(
        world,
        [&](ProcessGroup& pg) {
          ASSERT_EQ(pg.uses_hierarchical(), mode == Hierarchical::kSplit);
          std::vector<at::Tensor> mine;
          for (auto [op, dtype] : {std::pair{ReduceOp::kSum, at::kFloat},
                                   std::pair{ReduceOp::kAvg, at::kFloat},
                                   std::pair{ReduceOp::kAvg, at::kBFloat16}}) {
            auto t = input(pg.rank(), dtype);
            pg.all_reduce(t, op);
            mine.push_back(t.to(at::kFloat));
          }
          std::lock_guard<std::mutex> lock(mutex);
          results[{pg.rank(), mode == Hierarchical::kSplit}] = std::move(mine);
        },
        hosts_of(layout, mode));
  }
  for (int r = 0; r < world; ++r) {
    const auto& flat = results.at({r, false});
    const auto& hier = results.at({r, true});
    EXPECT_TRUE(at::allclose(hier[0], flat[0], 1e-5, 1e-5)) << "sum, rank " << r;
    EXPECT_TRUE(at::allclose(hier[1], flat[1], 1e-5, 1e-6)) << "avg, rank " << r;
    EXPECT_TRUE(at::allclose(hier[2], flat[2], 1e-2, 1e-2)) << "bf16 avg, rank " << r;
    // Every rank holds the same result, bit for bit.
    EXPECT_TRUE(at::equal(hier[0], results.at({0, true})[0])) << "rank " << r;
  }
}

// ---- the switch and the forms -----------------------------------------------

TEST(Hierarchical, TheSwitchTurnsItOffAndTheFormsCanBeForced) {
  run_ranks_with_options(
      4, [](ProcessGroup& pg) { EXPECT_FALSE(pg.uses_hierarchical()); },
      hosts_of("aabb", Hierarchical::kOff));
  run_ranks_with_options(
      4,
      [](ProcessGroup& pg) {
        EXPECT_EQ(pg.hierarchical_form(), "leader");
        auto t = rank_values(pg.rank(), 9, at::kFloat);
        pg.all_reduce(t, ReduceOp::kSum);
        expect_close(t, reduced_values(4, 9, ReduceOp::kSum), "leader all_reduce");
      },
      hosts_of("abab", Hierarchical::kLeader));
  EXPECT_EQ(parse_hierarchical("off"), Hierarchical::kOff);
  EXPECT_EQ(parse_hierarchical("SPLIT"), Hierarchical::kSplit);
  EXPECT_EQ(parse_hierarchical("0"), Hierarchical::kOff);
  EXPECT_THROW(parse_hierarchical("ring"), UsageError);
  auto env = RankEnv::from_map({{"TANDEM_HIERARCHICAL", "leader"}});
  EXPECT_EQ(env.hierarchical, "leader");
}

TEST(Hierarchical, ForcingTheSplitFormOnUnequalHostsIsAClearError) {
  try {
    run_ranks_with_options(3, [](ProcessGroup&) { ADD_FAILURE() << "connected"; },
                           hosts_of("aab", Hierarchical::kSplit));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("hierarchical=split needs as many ranks on every host, "
                                         "but the hosts hold ranks [0, 1], [2]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Hierarchical, RanksWithDifferentSettingsAreNamedInsteadOfHanging) {
  try {
    run_ranks_with_options(
        3, [](ProcessGroup&) { ADD_FAILURE() << "connected"; },
        [](int rank) {
          auto options = hosts_of("aab")(rank);
          if (rank == 2) options.hierarchical = Hierarchical::kOff;
          return options;
        });
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 has 'shared_memory=on hierarchical=auto' but "
                                         "rank 2 'shared_memory=on hierarchical=off'"),
              std::string::npos)
        << e.what();
  }
}

// ---- async, subgroups, errors -----------------------------------------------

TEST(Hierarchical, AsyncAllReducesCompleteInOrderWithTheirOwnResults) {
  run_ranks_with_options(
      4,
      [](ProcessGroup& pg) {
        ASSERT_TRUE(pg.uses_hierarchical());
        std::vector<at::Tensor> tensors;
        std::vector<Work> works;
        for (int k = 0; k < 6; ++k) {
          tensors.push_back(rank_values(pg.rank(), 100 + k, at::kFloat).mul(k + 1));
          works.push_back(pg.all_reduce_async(tensors.back(), k % 2 ? ReduceOp::kMax
                                                                     : ReduceOp::kSum));
        }
        for (int k = 0; k < 6; ++k) {
          works[static_cast<std::size_t>(k)].wait();
          const auto op = k % 2 ? ReduceOp::kMax : ReduceOp::kSum;
          expect_close(tensors[static_cast<std::size_t>(k)],
                       reduced_values(4, 100 + k, op).mul(k + 1), "async " + std::to_string(k));
        }
      },
      hosts_of("abba"));
}

TEST(Hierarchical, SubgroupsSpanningHostsGoHierarchicalOverTheirOwnRanks) {
  // World hosts: a a b b c. Subgroup {0, 1, 2, 3} holds two hosts of two
  // (split); {1, 2, 3, 4} holds hosts of 1, 2 and 1 (leader).
  run_ranks_with_options(
      5,
      [](ProcessGroup& world) {
        for (const std::vector<int>& ranks : {std::vector<int>{0, 1, 2, 3},
                                              std::vector<int>{1, 2, 3, 4}}) {
          auto group = world.new_group(ranks);
          if (!group->is_member()) continue;
          EXPECT_EQ(group->hierarchical_form(), ranks[0] == 0 ? "split" : "leader");
          const int g = group->rank();
          auto t = rank_values(g, 11, at::kFloat);
          group->all_reduce(t, ReduceOp::kAvg);
          expect_close(t, reduced_values(4, 11, ReduceOp::kAvg), "subgroup all_reduce");
          auto shard = at::empty({5}, at::kLong);
          group->reduce_scatter(shard, rank_values(g, 20, at::kLong), ReduceOp::kMin);
          expect_close(shard, reduced_values(4, 20, ReduceOp::kMin).narrow(0, g * 5, 5),
                       "subgroup reduce_scatter");
          auto gathered = group->all_gather(rank_values(g, 3, at::kInt));
          for (int k = 0; k < 4; ++k) {
            EXPECT_TRUE(at::equal(gathered[static_cast<std::size_t>(k)],
                                  rank_values(k, 3, at::kInt)));
          }
        }
      },
      hosts_of("aabbc"));
}

TEST(Hierarchical, ADesyncOnTheHierarchicalPathNamesTheRanks) {
  std::mutex mutex;
  std::map<int, std::string> messages;
  run_ranks_with_options(
      5,
      [&](ProcessGroup& world) {
        auto group = world.new_group({0, 2, 3, 4});  // hosts a b a b: split
        if (!group->is_member()) return;
        EXPECT_TRUE(group->uses_hierarchical());
        auto t = at::ones({group->rank() == 3 ? 5 : 4});
        std::string text;
        try {
          group->all_reduce(t);
        } catch (const UsageError& e) {
          text = e.what();
        }
        std::lock_guard<std::mutex> lock(mutex);
        messages[world.rank()] = text;
      },
      hosts_of("acbab"));
  ASSERT_EQ(messages.size(), 4u);
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("collective desync at #0 in group [0, 2, 3, 4]: ranks 0, 2, 3 (ranks "
                           "0, 1, 2 of group [0, 2, 3, 4]) called all_reduce Float[4] (sum) but "
                           "rank 4 (rank 3 of group [0, 2, 3, 4]) called all_reduce Float[5] "
                           "(sum)"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

TEST(Hierarchical, ATimeoutNamesTheRankThatDidNotArrive) {
  std::mutex mutex;
  std::map<int, std::string> messages;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> waiting{3};
  run_ranks_with_options(
      4,
      [&](ProcessGroup& pg) {
        auto t = at::ones({8});
        pg.all_reduce(t);  // #0 on every rank
        if (pg.rank() == 3) {
          released.wait();  // skips #1 and stays connected
          return;
        }
        std::string text;
        try {
          pg.all_reduce(t);
        } catch (const TimeoutError& e) {
          text = e.what();
        } catch (const std::exception& e) {
          text = std::string("not a TimeoutError: ") + e.what();
        }
        {
          std::lock_guard<std::mutex> lock(mutex);
          messages[pg.rank()] = text;
        }
        if (--waiting == 0) release.set_value();
        released.wait();
      },
      [](int rank) {
        auto options = hosts_of("abab")(rank);
        options.timeout = std::chrono::milliseconds(1500);
        options.progress_interval = std::chrono::milliseconds(100);
        options.desync_check_collectives = 0;  // the timeout must come from the inner steps
        return options;
      });
  ASSERT_EQ(messages.size(), 3u);
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("all_reduce #1 Float[8] on shm+gloo timed out after"),
              std::string::npos)
        << "rank " << rank << ": " << message;
    EXPECT_NE(message.find("rank 3 did not arrive (rank 3 last entered all_reduce #0"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

}  // namespace
}  // namespace tandem
