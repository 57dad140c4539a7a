// Misuse of subgroups and of the new collectives: a rank outside a group,
// ranks that pass different groups, a desync or a timeout inside a subgroup
// (named by global and group rank), and all_to_all split sizes that disagree.
// Each gives every rank involved a clear error instead of a hang.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>

#include "support/thread_ranks.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::rank_errors;
using testing::run_ranks;

TEST(GroupErrors, ARankOutsideAGroupIsToldWhichRanksAreInIt) {
  run_ranks(5, [](ProcessGroup& pg) {
    auto group = pg.new_group({0, 2, 3});
    if (group->is_member()) return;
    const std::string expected = fmt::format(
        "rank {} is not a member of group [0, 2, 3] (its ranks are 0, 2, 3)", pg.rank());
    auto t = at::ones({7});
    auto out = at::empty({21});
    std::vector<std::pair<std::string, std::function<void()>>> calls = {
        {"all_reduce", [&] { group->all_reduce(t); }},
        {"broadcast", [&] { group->broadcast(t, 0); }},
        {"all_gather", [&] { group->all_gather(t); }},
        {"all_gather_into", [&] { group->all_gather_into(out, t); }},
        {"reduce_scatter", [&] { group->reduce_scatter(t, out); }},
        {"barrier", [&] { group->barrier(); }},
        {"all_to_all", [&] { group->all_to_all(out, out); }},
        {"gather", [&] { group->gather(t); }},
        {"scatter", [&] { group->scatter(t, {}); }},
        {"send", [&] { group->send(t, 0); }},
        {"recv", [&] { group->recv(t, 0); }},
        {"new_group", [&] { group->new_group({0}); }},
    };
    for (auto& [name, call] : calls) {
      try {
        call();
        ADD_FAILURE() << name << " ran on a rank outside the group";
      } catch (const UsageError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(name + ": " + expected), std::string::npos) << message;
        EXPECT_NE(message.find("is_member()"), std::string::npos) << message;
      }
    }
    EXPECT_EQ(group->rank(), -1);
  });
}

TEST(GroupErrors, RanksThatPassDifferentGroupsAreNamedOnEveryRank) {
  auto messages = rank_errors<UsageError>(3, [](ProcessGroup& pg) {
    pg.new_group(pg.rank() == 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 0});
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("new_group #0: the ranks passed different groups: ranks 0, 1 passed "
                           "[0, 2] but rank 2 passed [0, 1]"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
  messages = rank_errors<UsageError>(2, [](ProcessGroup& pg) { pg.new_group({1, 2}); });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 2 is not a rank of the parent group, whose ranks are 0..1"),
              std::string::npos)
        << message;
  }
  messages = rank_errors<UsageError>(4, [](ProcessGroup& pg) { pg.split_group({{0, 1}, {1, 2}}); });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 1 is named twice: in list 0 [0, 1] at position 1 and in list 1 "
                           "[1, 2] at position 0; a rank belongs to one group"),
              std::string::npos)
        << message;
  }
}

// A rank repeated within one list: the message names that list as the
// caller wrote it and both positions, not the list twice.
TEST(GroupErrors, ARankRepeatedInOneListIsNamedWithItsPositions) {
  auto messages = rank_errors<UsageError>(2, [](ProcessGroup& pg) { pg.new_group({0, 0}); });
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("new_group: rank 0 is named twice in [0, 0], at positions 0 and 1; "
                           "name each rank once"),
              std::string::npos)
        << message;
  }
  messages = rank_errors<UsageError>(3, [](ProcessGroup& pg) {
    pg.split_group({{0}, {1, 2, 1}});
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 1 is named twice in [1, 2, 1] (list 1), at positions 0 and 2"),
              std::string::npos)
        << message;
  }
}

TEST(GroupErrors, ADesyncInASubgroupNamesGlobalAndGroupRanks) {
  auto messages = rank_errors<UsageError>(5, [](ProcessGroup& pg) {
    auto group = pg.new_group({0, 2, 3});
    if (!group->is_member()) return;
    auto same = at::ones({2});
    group->all_reduce(same);
    auto t = at::ones({pg.rank() == 3 ? 5 : 4});
    group->all_reduce(t);
  });
  for (int rank : {0, 2, 3}) {
    EXPECT_NE(messages[rank].find(
                  "collective desync at #1 in group [0, 2, 3]: ranks 0, 2 (ranks 0, 1 of group "
                  "[0, 2, 3]) called all_reduce Float[4] (sum) but rank 3 (rank 2 of group [0, "
                  "2, 3]) called all_reduce Float[5] (sum)"),
              std::string::npos)
        << "rank " << rank << ": " << messages[rank];
  }
}

TEST(GroupErrors, ATimeoutInASubgroupNamesTheMissingRankByBothRanks) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.progress_interval = std::chrono::milliseconds(100);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> waiting{2};
  std::mutex mutex;
  std::map<int, std::string> messages;
  run_ranks(
      5,
      [&](ProcessGroup& pg) {
        auto group = pg.new_group({0, 2, 3});
        if (group->is_member()) {
          auto t = at::ones({4});
          group->all_reduce(t);  // #0 on every member
          if (pg.rank() != 3) {
            try {
              group->all_reduce(t);  // rank 3 never arrives
              ADD_FAILURE() << "all_reduce #1 completed without rank 3";
            } catch (const TimeoutError& e) {
              std::lock_guard<std::mutex> lock(mutex);
              messages[pg.rank()] = e.what();
            }
            // Keep this rank's connections open until the other one has its
            // error too.
            if (--waiting == 0) release.set_value();
          }
        }
        released.wait();
      },
      options);
  for (int rank : {0, 2}) {
    const std::string& message = messages[rank];
    EXPECT_NE(message.find(fmt::format("[rank {}/5]", rank)), std::string::npos) << message;
    EXPECT_NE(message.find("all_reduce #1 Float[4] on shm in group [0, 2, 3] timed out after "
                           "1500 ms: rank 3 (rank 2 of group [0, 2, 3]) did not arrive (rank 3 "
                           "last entered all_reduce #0 Float[4] on shm in group [0, 2, 3] (sum) (as "
                           "of its last report, "),
              std::string::npos)
        << message;
  }
}

TEST(GroupErrors, AllToAllSplitsThatDisagreeAreNamedOnEveryRank) {
  auto messages = rank_errors<UsageError>(3, [](ProcessGroup& pg) {
    // Each rank sends 1 row to each; rank 2 expects 2 rows from rank 0.
    std::vector<int64_t> out_splits = {1, 1, 1};
    if (pg.rank() == 2) out_splits = {2, 1, 0};
    auto input = at::ones({3});
    auto output = at::empty({3});
    pg.all_to_all(output, input, out_splits, {1, 1, 1});
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 0 sends 1 row(s) to rank 2 (its input_splits[2]) but rank 2 "
                           "expects 2 from rank 0 (its output_splits[0])"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
  messages = rank_errors<UsageError>(2, [](ProcessGroup& pg) {
    auto t = at::ones({pg.rank() == 0 ? 4 : 6});
    auto out = at::empty_like(t);
    pg.all_to_all(out, t);
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("rank 0 called all_to_all Float[4] but rank 1 called all_to_all "
                           "Float[6]"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
  messages = rank_errors<UsageError>(1, [](ProcessGroup& pg) {
    auto out = at::empty({3});
    pg.all_to_all(out, at::ones({4}), {3}, {5});
  });
  EXPECT_NE(messages[0].find("input_splits sums to 5 rows but the tensor's dim 0 has 4"),
            std::string::npos)
      << messages[0];
}

TEST(GroupErrors, GatherAndScatterRootsThatDisagreeAreADesync) {
  auto messages = rank_errors<UsageError>(3, [](ProcessGroup& pg) {
    pg.gather(at::ones({7}), pg.rank() == 1 ? 1 : 0);
  });
  for (const auto& [rank, message] : messages) {
    EXPECT_NE(message.find("ranks 0, 2 called gather Float[7] (root 0) but rank 1 called gather "
                           "Float[7] (root 1)"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
  messages = rank_errors<UsageError>(1, [](ProcessGroup& pg) {
    auto out = at::empty({7});
    pg.scatter(out, {at::ones({7}), at::ones({7})}, 0);  // two tensors for one rank
  });
  EXPECT_NE(messages[0].find("scatter: the root passed 2 input tensor(s); it needs one per rank "
                             "(1)"),
            std::string::npos)
      << messages[0];
}

}  // namespace
}  // namespace tandem
