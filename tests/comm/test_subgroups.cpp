// Subgroups: new_group and split_group give each member its group rank and
// size; every collective tandem had before subgroups works on one, on both
// transports, against closed-form values computed from the members' global
// ranks; a subgroup uses shared memory exactly when its ranks share a host;
// and making groups is counted and checked like any collective.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <mutex>
#include <thread>

#include "support/group_cases.h"
#include "support/thread_ranks.h"
#include "tandem/comm/objects.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;
using testing::run_ranks_with_options;
using testing::subgroup_members;

// Global rank g holds (g + 1) * (i % 7 + 1) at element i.
at::Tensor subgroup_tensor(int global_rank, int64_t n, at::ScalarType dtype = at::kFloat) {
  return at::arange(n, at::kLong).remainder(7).add(1).mul(global_rank + 1).to(dtype);
}

TEST(Subgroups, MembersGetTheirGroupRankAndOthersANonMemberHandle) {
  run_ranks(5, [](ProcessGroup& pg) {
    const auto before = pg.sequence_number();
    auto group = pg.new_group({3, 0, 2});  // any order; group rank = position when sorted
    EXPECT_EQ(pg.sequence_number(), before + 1);
    EXPECT_EQ(group->world_size(), 3);
    EXPECT_EQ(group->global_ranks(), (std::vector<int>{0, 2, 3}));
    const std::map<int, int> group_rank = {{0, 0}, {2, 1}, {3, 2}};
    auto it = group_rank.find(pg.rank());
    EXPECT_EQ(group->is_member(), it != group_rank.end());
    EXPECT_EQ(group->rank(), it != group_rank.end() ? it->second : -1);
    if (group->is_member()) {
      EXPECT_EQ(group->sequence_number(), 0u);
    }
  });
}

// (world, shared memory): the collectives of test_collectives.cpp on the
// subgroup subgroup_members(world), including a subgroup of one rank.
class SubgroupCollectives : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(SubgroupCollectives, EveryCollectiveMatchesTheClosedFormOverTheMembers) {
  const auto [world, shared_memory] = GetParam();
  ProcessGroupOptions options;
  options.shared_memory = shared_memory;
  const std::vector<int> members = subgroup_members(world);
  const int size = static_cast<int>(members.size());
  run_ranks(
      world,
      [&, shared_memory = shared_memory](ProcessGroup& pg) {
        auto group = pg.new_group(members);
        if (!group->is_member()) return;
        EXPECT_EQ(group->uses_shared_memory(), shared_memory && size > 1);
        const int me = pg.rank();  // global
        for (int64_t n : {0, 1, 7, 13}) {
          auto pattern = at::arange(n, at::kLong).remainder(7).add(1).to(at::kFloat);
          int sum = 0, top = 0;
          for (int g : members) sum += g + 1, top = std::max(top, g + 1);
          auto t = subgroup_tensor(me, n);
          group->all_reduce(t);
          ASSERT_TRUE(at::equal(t, pattern.mul(sum))) << "all_reduce n " << n;
          auto m = subgroup_tensor(me, n, at::kBFloat16);
          group->all_reduce_async(m, ReduceOp::kMax).wait();
          ASSERT_TRUE(at::equal(m, pattern.mul(top).to(at::kBFloat16))) << "max n " << n;

          const int root = size - 1;
          auto b = subgroup_tensor(me, n);
          group->broadcast(b, root);
          ASSERT_TRUE(at::equal(b, subgroup_tensor(members.back(), n))) << "broadcast";

          auto gathered = group->all_gather(subgroup_tensor(me, n));
          auto flat = at::empty({size * n});
          group->all_gather_into(flat, subgroup_tensor(me, n));
          for (int r = 0; r < size; ++r) {
            ASSERT_TRUE(at::equal(gathered[static_cast<size_t>(r)], subgroup_tensor(members[r], n)));
            ASSERT_TRUE(at::equal(flat.narrow(0, r * n, n), subgroup_tensor(members[r], n)));
          }

          auto out = at::empty({n});
          group->reduce_scatter(out, subgroup_tensor(me, size * n), ReduceOp::kSum);
          auto whole = at::arange(size * n, at::kLong).remainder(7).add(1).to(at::kFloat).mul(sum);
          ASSERT_TRUE(at::equal(out, whole.narrow(0, group->rank() * n, n))) << "reduce_scatter";
        }
        group->barrier();
        auto names = group->all_gather_strings(std::string(static_cast<size_t>(me), 'x'));
        // Six collectives for each of four sizes, then two; none on one rank.
        EXPECT_EQ(group->sequence_number(), size > 1 ? 6u * 4 + 2 : 0u);
        auto objects = gather_object(*group, std::to_string(me));
        for (int r = 0; r < size; ++r) {
          EXPECT_EQ(names[static_cast<size_t>(r)], std::string(static_cast<size_t>(members[r]), 'x'));
          EXPECT_EQ(objects[static_cast<size_t>(r)], std::to_string(members[r]));
        }
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(WorldsAndTransports, SubgroupCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5), ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_shm" : "_gloo");
                         });

// Ranks 0, 1 on host "a" and 2, 3 on host "b".
ProcessGroupOptions two_hosts(int rank) {
  ProcessGroupOptions options;
  options.host_id = rank < 2 ? "a" : "b";
  return options;
}

TEST(Subgroups, UseSharedMemoryExactlyWhenTheirRanksShareAHost) {
  run_ranks_with_options(
      4,
      [](ProcessGroup& pg) {
        EXPECT_FALSE(pg.uses_shared_memory());  // the world spans two hosts
        auto on_one = pg.split_group({{0, 1}, {2, 3}});
        auto across = pg.split_group({{0, 2}, {1, 3}});
        EXPECT_TRUE(on_one->uses_shared_memory());
        EXPECT_FALSE(across->uses_shared_memory());
        auto t = subgroup_tensor(pg.rank(), 5);
        on_one->all_reduce(t);
        across->all_reduce(t);  // together: the world's sum, as a flat all-reduce gives
        auto flat = subgroup_tensor(pg.rank(), 5);
        pg.all_reduce(flat);
        EXPECT_TRUE(at::equal(t, flat));
      },
      two_hosts);
}

// host_ids() is what the group gathered when it connected: every rank's
// host, by group rank, with no collective of its own; in a subgroup, its
// members' hosts; alone, this rank's.
TEST(Subgroups, HostIdsListEveryMembersHostWithoutACollective) {
  for (bool shared_memory : {false, true}) {
    run_ranks_with_options(
        3,
        [](ProcessGroup& pg) {
          const auto before = pg.sequence_number();
          EXPECT_EQ(pg.host_ids(), (std::vector<std::string>{"a", "a", "b"}));
          EXPECT_EQ(pg.sequence_number(), before);
          auto pair = pg.new_group({1, 2});
          auto alone = pg.split_group({{0}, {1}, {2}});
          EXPECT_EQ(alone->host_ids(), std::vector<std::string>{pg.rank() < 2 ? "a" : "b"});
          if (pair->is_member()) {
            EXPECT_EQ(pair->host_ids(), (std::vector<std::string>{"a", "b"}));
          } else {
            EXPECT_TRUE(pair->host_ids().empty());
          }
        },
        [shared_memory](int rank) {
          ProcessGroupOptions options = two_hosts(rank);
          options.shared_memory = shared_memory;
          return options;
        });
  }
}

TEST(Subgroups, AGroupOfAGroupNumbersItsRanksWithinItsParent) {
  std::mutex mutex;
  std::map<int, std::string> errors;
  run_ranks(5, [&](ProcessGroup& pg) {
    auto outer = pg.new_group({1, 2, 3, 4});
    if (!outer->is_member()) {
      pg.barrier();
      return;
    }
    auto inner = outer->new_group({0, 2});  // outer ranks: global 1 and 3
    if (inner->is_member()) {
      EXPECT_EQ(inner->global_ranks(), (std::vector<int>{1, 3}));
      auto t = subgroup_tensor(pg.rank(), 3);
      inner->all_reduce(t);
      EXPECT_TRUE(at::equal(t, subgroup_tensor(0, 3).mul(2 + 4)));
    } else {
      try {
        inner->barrier();
      } catch (const UsageError& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors[pg.rank()] = e.what();
      }
    }
    pg.barrier();
  });
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[2].find("rank 2 is not a member of group [1, 3]"), std::string::npos)
      << errors[2];
}

TEST(Subgroups, OutliveTheHandleOfTheirParent) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(3);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      ProcessGroupOptions options;
      options.timeout = std::chrono::seconds(30);
      auto pg = ProcessGroup::create(store, rank, 3, options);
      groups[static_cast<size_t>(rank)] = pg->new_group({0, 1, 2});
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = at::ones({4});
      groups[static_cast<size_t>(rank)]->all_reduce(t);
      EXPECT_TRUE(at::equal(t, at::full({4}, 3.0f)));
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace tandem
