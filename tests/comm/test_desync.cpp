// Desync detection: ranks that call different collectives, shapes or dtypes
// get a UsageError naming the ranks and what each called, before the
// collective runs; after the first N collectives only debug mode checks.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <map>
#include <mutex>

#include "comm/collective_fingerprint.h"
#include "support/thread_ranks.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;

// Each rank's UsageError message ("" if it threw none).
std::map<int, std::string> usage_errors(int world, const ProcessGroupOptions& options,
                                        const std::function<void(ProcessGroup&)>& fn) {
  return testing::rank_errors<UsageError>(world, fn, options);
}

ProcessGroupOptions with_transport(bool shared_memory) {
  ProcessGroupOptions options;
  options.shared_memory = shared_memory;
  options.timeout = std::chrono::seconds(20);
  return options;
}

class Desync : public ::testing::TestWithParam<bool> {};

TEST_P(Desync, DifferentOperationsNameEachRankAndWhatItCalled) {
  auto messages = usage_errors(2, with_transport(GetParam()), [](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      auto t = at::ones({10});
      pg.all_reduce(t);
    } else {
      auto t = at::ones({12});
      pg.broadcast(t, 0);
    }
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("collective desync at #0: rank 0 called all_reduce Float[10] (sum) "
                           "but rank 1 called broadcast Float[12] (root 0)"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

TEST_P(Desync, DifferentShapesNameTheRanksAndBothShapes) {
  auto messages = usage_errors(3, with_transport(GetParam()), [](ProcessGroup& pg) {
    auto same = at::ones({3});
    pg.all_reduce(same);  // #0 agrees
    auto t = at::ones({4, pg.rank() == 1 ? 9 : 8});
    pg.all_reduce(t, ReduceOp::kMax);
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("collective desync at #1: ranks 0, 2 called all_reduce Float[4, 8] "
                           "(max) but rank 1 called all_reduce Float[4, 9] (max)"),
              std::string::npos)
        << "rank " << rank << ": " << message;
    EXPECT_NE(message.find("same collectives in the same order"), std::string::npos) << message;
  }
}

TEST_P(Desync, DifferentDtypesAreNamed) {
  auto messages = usage_errors(2, with_transport(GetParam()), [](ProcessGroup& pg) {
    auto t = at::ones({5}, pg.rank() == 0 ? at::kFloat : at::kDouble);
    pg.all_gather(t);
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 0 called all_gather Float[5] but rank 1 called all_gather "
                           "Double[5]"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

void expect_every_message_has(const std::map<int, std::string>& messages,
                              const std::string& text) {
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find(text), std::string::npos) << "rank " << rank << ": " << message;
  }
}

// ZeRO's collectives: a gather against a scatter, then a scatter whose
// input differs on one rank (a shard size computed differently there).
TEST_P(Desync, GatherAgainstScatterAndScatterShapesAreNamed) {
  auto messages = usage_errors(3, with_transport(GetParam()), [](ProcessGroup& pg) {
    auto shard = at::ones({7}, at::kBFloat16);
    auto whole = at::ones({21}, at::kBFloat16);
    if (pg.rank() == 2) {
      pg.reduce_scatter(shard, whole, ReduceOp::kAvg);
    } else {
      pg.all_gather_into(whole, shard);
    }
  });
  expect_every_message_has(messages,
                           "collective desync at #0: ranks 0, 1 called all_gather_into "
                           "BFloat16[7] but rank 2 called reduce_scatter BFloat16[21] (avg)");
  messages = usage_errors(2, with_transport(GetParam()), [](ProcessGroup& pg) {
    auto shard = at::ones({pg.rank() == 0 ? 5 : 4});
    auto whole = at::ones({2 * shard.numel()});
    pg.reduce_scatter(shard, whole);
  });
  expect_every_message_has(messages,
                           "rank 0 called reduce_scatter Float[10] (sum) but rank 1 called "
                           "reduce_scatter Float[8] (sum)");
}

INSTANTIATE_TEST_SUITE_P(Transports, Desync, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "gloo"; });

TEST(DesyncCheck, AnEmptyTensorOnOneRankIsCaughtInsteadOfHanging) {
  auto messages = usage_errors(2, with_transport(false), [](ProcessGroup& pg) {
    auto in = at::ones({pg.rank() == 0 ? 0 : 3});
    auto out = at::empty({2 * in.numel()});
    pg.all_gather_into(out, in);
  });
  EXPECT_NE(messages[1].find("rank 0 called all_gather_into Float[0] but rank 1 called "
                             "all_gather_into Float[3]"),
            std::string::npos)
      << messages[1];
}

// A reduce-op mismatch does not hang, so it shows whether a check ran: each
// rank then reduces with its own op and nobody notices.
void mismatched_reduce_at(ProcessGroup& pg, std::uint64_t when) {
  for (std::uint64_t i = 0; i < when; ++i) {
    auto t = at::ones({6});
    pg.all_reduce(t);
  }
  auto t = at::ones({6});
  pg.all_reduce(t, pg.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax);
}

// On Gloo: the shared-memory transport compares every call's shape itself
// (ShmCallCheck below).
TEST(DesyncCheck, IsOnForTheFirstCollectivesOnly) {
  auto options = with_transport(false);
  options.desync_check_collectives = 3;
  auto inside = usage_errors(2, options, [](ProcessGroup& pg) { mismatched_reduce_at(pg, 2); });
  EXPECT_NE(inside[0].find("collective desync at #2: rank 0 called all_reduce Float[6] (sum) but "
                           "rank 1 called all_reduce Float[6] (max)"),
            std::string::npos)
      << inside[0];
  auto after = usage_errors(2, options, [](ProcessGroup& pg) { mismatched_reduce_at(pg, 3); });
  EXPECT_EQ(after[0], "");
  EXPECT_EQ(after[1], "");
}

// Past the window, the shared-memory transport still compares what each
// rank passed: sizes that differ by one element (the same number of rounds,
// so nothing would hang) or another reduce op give every rank a CommError
// naming each rank's call, instead of silently mixed results.
class ShmCallCheck : public ::testing::TestWithParam<int> {};

std::map<int, std::string> shm_comm_errors(int world, const std::function<void(ProcessGroup&)>& fn) {
  auto options = with_transport(true);
  options.desync_check_collectives = 0;
  options.timeout = std::chrono::seconds(5);  // a missed check would hang, not pass
  return testing::rank_errors<CommError>(world, fn, options);
}

TEST_P(ShmCallCheck, DifferentSizesOrReduceOpsPastTheWindowAreNamedOnEveryRank) {
  const int world = GetParam();
  auto messages = shm_comm_errors(world, [](ProcessGroup& pg) {
    auto t = at::ones({pg.rank() == 1 ? 1001 : 1000});
    pg.all_reduce(t);
  });
  const std::string others = world == 2 ? "rank 0" : "ranks 0, 2";
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("all_reduce #0 Float[" + std::to_string(rank == 1 ? 1001 : 1000) +
                           "] on shm: the ranks passed different tensors to it: " + others +
                           " called all_reduce of 1000 Float elements (sum) but rank 1 called "
                           "all_reduce of 1001 Float elements (sum)"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
  messages = shm_comm_errors(world, [](ProcessGroup& pg) {
    auto t = at::ones({6});
    pg.all_reduce(t, pg.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax);
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 0 called all_reduce of 6 Float elements (sum) but rank"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
  messages = shm_comm_errors(world, [](ProcessGroup& pg) {
    auto part = at::ones({pg.rank() == 0 ? 5 : 4}, at::kDouble);
    pg.gather(part, 0);
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("the ranks passed different tensors to it: rank 0 called exchange "
                           "moving " + std::to_string(5 * 8 * world) + " bytes but"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmCallCheck, ::testing::Values(2, 3));

TEST(DesyncCheck, DebugDetailChecksEveryCollective) {
  auto options = with_transport(false);
  options.desync_check_collectives = 3;
  options.debug_detail = true;
  auto messages = usage_errors(2, options, [](ProcessGroup& pg) { mismatched_reduce_at(pg, 40); });
  EXPECT_NE(messages[1].find("collective desync at #40"), std::string::npos) << messages[1];
}

TEST(DesyncCheck, ByteGathersOfDifferentSizesAreOneCheckedCollective) {
  auto options = with_transport(false);
  options.debug_detail = true;
  run_ranks(
      3,
      [](ProcessGroup& pg) {
        const auto before = pg.sequence_number();
        auto all = pg.all_gather_strings(std::string(static_cast<std::size_t>(pg.rank()) * 5, 'x'));
        EXPECT_EQ(all[2], std::string(10, 'x'));
        EXPECT_EQ(pg.sequence_number(), before + 1);
      },
      options);
}

TEST(DesyncCheck, DebugDetailComesFromTandemOrTorchVariables) {
  EXPECT_TRUE(RankEnv::from_map({{"TANDEM_DEBUG", "DETAIL"}}).debug_detail);
  EXPECT_TRUE(RankEnv::from_map({{"TANDEM_DEBUG", "detail"}}).debug_detail);
  EXPECT_TRUE(RankEnv::from_map({{"TORCH_DISTRIBUTED_DEBUG", "DETAIL"}}).debug_detail);
  EXPECT_FALSE(RankEnv::from_map({{"TORCH_DISTRIBUTED_DEBUG", "INFO"}}).debug_detail);
  EXPECT_FALSE(RankEnv::from_map({{"TANDEM_DEBUG", "off"}, {"TORCH_DISTRIBUTED_DEBUG", "DETAIL"}})
                   .debug_detail);
  EXPECT_THROW(RankEnv::from_map({{"TANDEM_DEBUG", "verbose"}}), UsageError);
}

TEST(Fingerprint, DescribesLongShapesAndDevicesAndGroupsOfRanks) {
  auto big = at::empty({1, 2, 1, 2, 1, 2, 1, 3});
  auto a = detail::Fingerprint::of(detail::CollectiveOp::kAllGather, 4, &big);
  EXPECT_EQ(a.describe(true), "all_gather #4 Float[1, 2, 1, 2, 1, 2, 1, ... (8-d, 24 elements)]");
  auto b = detail::Fingerprint::of(detail::CollectiveOp::kBarrier, 4, nullptr);
  auto c = detail::Fingerprint::of(detail::CollectiveOp::kBarrier, 5, nullptr);
  EXPECT_EQ(detail::find_desync({a, a, a}), "");
  const std::string text = detail::find_desync({a, b, a, c});
  EXPECT_EQ(text.substr(0, text.find(". Every")),
            "collective desync: ranks 0, 2 called all_gather #4 Float[1, 2, 1, 2, 1, 2, 1, ... "
            "(8-d, 24 elements)] but rank 1 called barrier #4 and rank 3 called barrier #5");
}

}  // namespace
}  // namespace tandem
