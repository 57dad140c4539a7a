// Collectives on ranks-as-threads, checked against closed-form values.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <future>

#include "support/thread_ranks.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;

const std::vector<int64_t> kSizes = {0, 1, 7, 1 << 18};

// Rank r holds (r + 1) * pattern(i), pattern(i) = i % 7 + 1.
at::Tensor rank_tensor(int rank, int64_t n, at::ScalarType dtype) {
  auto pattern = at::arange(n, at::kLong).remainder(7).add(1);
  return pattern.mul(rank + 1).to(dtype);
}

at::Tensor expected_reduce(ReduceOp op, int world, int64_t n, at::ScalarType dtype) {
  auto pattern = at::arange(n, at::kLong).remainder(7).add(1).to(at::kDouble);
  switch (op) {
    case ReduceOp::kSum: return pattern.mul(world * (world + 1) / 2).to(dtype);
    case ReduceOp::kAvg: return pattern.mul((world + 1) / 2.0).to(dtype);
    case ReduceOp::kMax: return pattern.mul(world).to(dtype);
    case ReduceOp::kMin: return pattern.to(dtype);
  }
  return {};
}

class CollectivesByWorld : public ::testing::TestWithParam<int> {};

// All-reduce runs on two transports: shared memory (ranks on one host, the
// default) and Gloo. Both must give the closed-form result.
class AllReduceByWorldAndTransport : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(AllReduceByWorldAndTransport, EveryOpDtypeAndSizeMatchesClosedForm) {
  const auto [world, shared_memory] = GetParam();
  ProcessGroupOptions options;
  options.shared_memory = shared_memory;
  // 1<<18 fits one 4 MiB chunk; 2.5M + 3 elements spans three, unevenly.
  const std::vector<int64_t> sizes = {0, 1, 7, 1 << 18, (5 << 19) + 3};
  run_ranks(
      world,
      [&](ProcessGroup& pg) {
        ASSERT_EQ(pg.uses_shared_memory(), shared_memory && world > 1);
        for (auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16}) {
          for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
            if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
            for (int64_t n : sizes) {
              if (n > (1 << 18) && (dtype != at::kFloat || op == ReduceOp::kMin)) continue;
              auto t = rank_tensor(pg.rank(), n, dtype);
              pg.all_reduce(t, op);
              auto want = expected_reduce(op, world, n, dtype);
              ASSERT_TRUE(at::allclose(t.to(at::kDouble), want.to(at::kDouble)))
                  << "world " << world << " op " << to_string(op) << " n " << n << " dtype "
                  << c10::toString(dtype);
            }
          }
        }
      },
      options);
}

// Worlds 6 and 7 are left out: they add no case that 5 (odd, a chunk split
// that does not divide) and 8 (the largest, a power of two) do not cover, and
// cost a fifth of the suite's longest entry.
INSTANTIATE_TEST_SUITE_P(
    Worlds, AllReduceByWorldAndTransport,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8), ::testing::Bool()), [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_shm" : "_gloo");
    });

// bfloat16 and half sum in fp32 and round once, on either transport: the
// result is the fp32 sum (exact for a few such values) rounded to the dtype,
// whatever the order ranks are added in. Rounding after every addition
// gives other bits from world 3 on.
class HalfTypesByWorldAndTransport : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(HalfTypesByWorldAndTransport, SumsAndAveragesRoundOnce) {
  const auto [world, shared_memory] = GetParam();
  ProcessGroupOptions options;
  options.shared_memory = shared_memory;
  const int64_t n = 4099;  // beyond one 4096-element block, not a multiple of the world
  auto value = [&](int rank, at::ScalarType dtype) {
    auto gen = at::detail::createCPUGenerator(900 + rank);
    return at::randn({n * world}, gen).to(dtype);
  };
  run_ranks(
      world,
      [&](ProcessGroup& pg) {
        for (auto dtype : {at::kBFloat16, at::kHalf}) {
          at::Tensor total = at::zeros({n * world}, at::kFloat);
          for (int r = 0; r < world; ++r) total.add_(value(r, dtype).to(at::kFloat));
          for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            const at::Tensor want =
                (op == ReduceOp::kAvg ? total / static_cast<double>(world) : total).to(dtype);
            auto t = value(pg.rank(), dtype);
            pg.all_reduce(t, op);
            EXPECT_TRUE(at::equal(t, want)) << "all_reduce " << to_string(op) << " "
                                            << c10::toString(dtype);
            auto out = at::empty({n}, dtype);
            pg.reduce_scatter(out, value(pg.rank(), dtype), op);
            EXPECT_TRUE(at::equal(out, want.narrow(0, pg.rank() * n, n)))
                << "reduce_scatter " << to_string(op) << " " << c10::toString(dtype);
          }
        }
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, HalfTypesByWorldAndTransport,
    ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Bool()), [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_shm" : "_gloo");
    });

TEST_P(CollectivesByWorld, BroadcastFromEveryRoot) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    for (int root = 0; root < world; ++root) {
      for (int64_t n : kSizes) {
        // bfloat16 too: Gloo has no such type, tandem moves its bytes.
        for (auto dtype : {at::kFloat, at::kBFloat16}) {
          auto t = rank_tensor(pg.rank(), n, dtype);
          pg.broadcast(t, root);
          ASSERT_TRUE(at::equal(t, rank_tensor(root, n, dtype))) << "root " << root;
        }
      }
    }
  });
}

TEST_P(CollectivesByWorld, AllGatherReturnsEveryRanksTensorInRankOrder) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    for (int64_t n : kSizes) {
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        auto gathered = pg.all_gather(rank_tensor(pg.rank(), n, dtype));
        ASSERT_EQ(static_cast<int>(gathered.size()), world);
        for (int r = 0; r < world; ++r) {
          ASSERT_TRUE(at::equal(gathered[r], rank_tensor(r, n, dtype)));
          ASSERT_EQ(gathered[r].scalar_type(), dtype);
        }
        auto flat = at::empty({world * n}, dtype);
        pg.all_gather_into(flat, rank_tensor(pg.rank(), n, dtype));
        for (int r = 0; r < world; ++r) {
          ASSERT_TRUE(at::equal(flat.narrow(0, r * n, n), rank_tensor(r, n, dtype)));
        }
      }
    }
  });
}

TEST_P(CollectivesByWorld, ReduceScatterLeavesEachRankItsReducedChunk) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      for (int64_t n : kSizes) {
        auto input = rank_tensor(pg.rank(), n * world, at::kFloat);
        auto out = at::empty({n});
        pg.reduce_scatter(out, input, op);
        auto want = expected_reduce(op, world, n * world, at::kFloat).narrow(0, pg.rank() * n, n);
        ASSERT_TRUE(at::allclose(out, want)) << "op " << to_string(op) << " n " << n;
      }
    }
  });
}

TEST_P(CollectivesByWorld, GatherStringsOfDifferentLengths) {
  const int world = GetParam();
  run_ranks(world, [&](ProcessGroup& pg) {
    std::string mine(static_cast<size_t>(pg.rank() * 3), static_cast<char>('a' + pg.rank()));
    auto all = pg.all_gather_strings(mine);
    ASSERT_EQ(static_cast<int>(all.size()), world);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(all[r], std::string(static_cast<size_t>(r * 3), static_cast<char>('a' + r)));
    }
    pg.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(World1To8, CollectivesByWorld, ::testing::Range(1, 9),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(Collectives, AsyncAllReducesCompleteInAnyWaitOrder) {
  run_ranks(3, [](ProcessGroup& pg) {
    auto a = at::full({1000}, static_cast<float>(pg.rank()));
    auto b = at::full({10}, 1.0f);
    Work wa = pg.all_reduce_async(a, ReduceOp::kAvg);
    Work wb = pg.all_reduce_async(b, ReduceOp::kSum);
    wb.wait();
    wa.wait();
    EXPECT_TRUE(at::allclose(a, at::full({1000}, 1.0f)));
    EXPECT_TRUE(at::allclose(b, at::full({10}, 3.0f)));
  });
}

TEST(Collectives, LocalWorldIsANoOpThatNeedsNoStore) {
  auto pg = ProcessGroup::local();
  EXPECT_EQ(pg->world_size(), 1);
  EXPECT_EQ(pg->backend_name(), "local");
  auto t = at::arange(5, at::kFloat);
  pg->all_reduce(t, ReduceOp::kAvg);
  EXPECT_TRUE(at::equal(t, at::arange(5, at::kFloat)));
  auto out = at::empty({5});
  pg->reduce_scatter(out, t);
  EXPECT_TRUE(at::equal(out, t));
  EXPECT_EQ(pg->all_gather_strings("x"), std::vector<std::string>{"x"});
  pg->barrier();
  EXPECT_EQ(pg->sequence_number(), 0u);
}

class MissingRank : public ::testing::TestWithParam<bool> {};

TEST_P(MissingRank, TimesOutWithTheOperationNamed) {
  ProcessGroupOptions options;
  options.shared_memory = GetParam();
  options.timeout = std::chrono::milliseconds(1500);
  std::string message;
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future();
  auto start = std::chrono::steady_clock::now();
  run_ranks(
      2,
      [&](ProcessGroup& pg) {
        if (pg.rank() == 1) {
          // Stays connected but never joins the collective.
          rank0_done_future.wait();
          return;
        }
        auto t = at::ones({4});
        try {
          pg.all_reduce(t);
        } catch (const TimeoutError& e) {
          message = e.what();
        }
        rank0_done.set_value();
      },
      options);
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(10));
  EXPECT_NE(message.find("all_reduce #0"), std::string::npos) << message;
  EXPECT_NE(message.find("[rank 0/2]"), std::string::npos) << message;
  EXPECT_NE(message.find("1500 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 did not arrive"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Transports, MissingRank, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "gloo"; });

TEST(Collectives, BadArgumentsAreUsageErrors) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto ints = at::ones({3}, at::kLong);
    EXPECT_THROW(pg.all_reduce(ints, ReduceOp::kAvg), UsageError);
    auto out = at::empty({3});
    EXPECT_THROW(pg.all_gather_into(out, at::ones({2})), UsageError);
    EXPECT_THROW(pg.reduce_scatter(out, at::ones({5})), UsageError);
    auto t = at::ones({2, 2}).t();
    EXPECT_THROW(pg.all_reduce(t), UsageError);
    auto u = at::ones({2});
    EXPECT_THROW(pg.broadcast(u, 5), UsageError);
    pg.barrier();
  });
}

}  // namespace
}  // namespace tandem
