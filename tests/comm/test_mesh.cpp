// ProcessMesh: hosts x ranks-per-host groups, from an explicit shape or from
// the ranks' host ids (several hosts played in one process by giving each
// rank thread a host_id). Parity: reducing within each host and then across
// hosts, or sharding within a host and reducing the shard across hosts (the
// HSDP pattern), equals the flat world all-reduce.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <mutex>

#include "support/thread_ranks.h"
#include "tandem/comm/mesh.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;
using testing::run_ranks_with_options;

// Rank r's gradient: element i is (r + 1) * (i % 5 + 1) + i % 3.
at::Tensor mesh_gradient(int rank, int64_t n) {
  auto i = at::arange(n, at::kLong);
  return i.remainder(5).add(1).mul(rank + 1).add(i.remainder(3)).to(at::kFloat);
}

// Host ids for rank threads: hosts[r] is rank r's.
std::function<ProcessGroupOptions(int)> on_hosts(std::vector<std::string> hosts) {
  return [hosts](int rank) {
    ProcessGroupOptions options;
    options.host_id = hosts[static_cast<size_t>(rank)];
    return options;
  };
}

TEST(ProcessMesh, AnExplicitShapeGivesEachRankItsRowAndColumn) {
  run_ranks(6, [](ProcessGroup& world) {
    ProcessMesh mesh(world.shared_from_this(), {2, 3});
    const int r = world.rank();
    EXPECT_EQ(mesh.coordinate("host"), r / 3);
    EXPECT_EQ(mesh.coordinate("local"), r % 3);
    EXPECT_EQ(mesh.size("host"), 2);
    EXPECT_EQ(mesh.size("local"), 3);
    EXPECT_EQ(mesh.group("host")->global_ranks(), (std::vector<int>{r % 3, r % 3 + 3}));
    EXPECT_EQ(mesh.group("local")->global_ranks(),
              (std::vector<int>{r / 3 * 3, r / 3 * 3 + 1, r / 3 * 3 + 2}));
    EXPECT_EQ(mesh.group("host")->rank(), mesh.coordinate("host"));
    EXPECT_EQ(mesh.group("local")->rank(), mesh.coordinate("local"));
  });
}

TEST(ProcessMesh, TheShapeFollowsTheHostsAndOnlyTheLocalGroupSharesMemory) {
  run_ranks_with_options(
      6,
      [](ProcessGroup& world) {
        ProcessMesh mesh(world.shared_from_this(), {"replicate", "shard"});
        EXPECT_EQ(mesh.shape(), (std::array<int, 2>{3, 2}));
        EXPECT_TRUE(mesh.group("shard")->uses_shared_memory());
        EXPECT_FALSE(mesh.group("replicate")->uses_shared_memory());
        EXPECT_FALSE(world.uses_shared_memory());
      },
      on_hosts({"a", "a", "b", "b", "c", "c"}));
}

TEST(ProcessMesh, HierarchicalAndHybridShardedReductionsEqualTheFlatOne) {
  run_ranks_with_options(
      4,
      [](ProcessGroup& world) {
        ProcessMesh mesh(world.shared_from_this());
        ASSERT_EQ(mesh.shape(), (std::array<int, 2>{2, 2}));
        const int64_t n = 13 * 2;  // odd shard length
        auto flat = mesh_gradient(world.rank(), n);
        world.all_reduce(flat);

        auto two_level = mesh_gradient(world.rank(), n);
        mesh.group("local")->all_reduce(two_level);
        mesh.group("host")->all_reduce(two_level);
        EXPECT_TRUE(at::equal(two_level, flat));

        // HSDP: reduce-scatter within the host, all-reduce the shard across hosts.
        auto shard = at::empty({n / 2});
        mesh.group("local")->reduce_scatter(shard, mesh_gradient(world.rank(), n));
        mesh.group("host")->all_reduce(shard);
        EXPECT_TRUE(at::equal(shard, flat.narrow(0, mesh.coordinate("local") * (n / 2), n / 2)));
      },
      on_hosts({"a", "a", "b", "b"}));
}

TEST(ProcessMesh, OneHostGivesAHostGroupOfOneRank) {
  run_ranks(3, [](ProcessGroup& world) {
    ProcessMesh mesh(world.shared_from_this());
    EXPECT_EQ(mesh.shape(), (std::array<int, 2>{1, 3}));
    EXPECT_EQ(mesh.group("host")->world_size(), 1);
    auto t = mesh_gradient(world.rank(), 7);
    mesh.group("host")->all_reduce(t);  // a group of one: unchanged
    EXPECT_TRUE(at::equal(t, mesh_gradient(world.rank(), 7)));
  });
}

// Every rank's UsageError message when building a mesh on `hosts`.
std::vector<std::string> mesh_errors(const std::vector<std::string>& hosts,
                                     const std::function<void(ProcessGroup&)>& build) {
  std::mutex mutex;
  std::vector<std::string> messages(hosts.size());
  run_ranks_with_options(
      static_cast<int>(hosts.size()),
      [&](ProcessGroup& world) {
        try {
          build(world);
        } catch (const UsageError& e) {
          std::lock_guard<std::mutex> lock(mutex);
          messages[static_cast<size_t>(world.rank())] = e.what();
        }
      },
      on_hosts(hosts));
  return messages;
}

TEST(ProcessMesh, UnevenOrInterleavedHostsAndBadShapesAreNamed) {
  auto derive = [](ProcessGroup& world) { ProcessMesh mesh(world.shared_from_this()); };
  for (const auto& m : mesh_errors({"a", "a", "a", "b"}, derive)) {
    EXPECT_NE(m.find("host 'a' holds 3 rank(s) (0, 1, 2) but host 'b' holds 1 (3)"),
              std::string::npos)
        << m;
  }
  for (const auto& m : mesh_errors({"a", "b", "a", "b"}, derive)) {
    EXPECT_NE(m.find("host 'a' holds ranks 0, 2, which are not consecutive (rank 1 is on host "
                     "'b')"),
              std::string::npos)
        << m;
  }
  auto wrong_shape = [](ProcessGroup& world) { ProcessMesh mesh(world.shared_from_this(), {3, 2}); };
  for (const auto& m : mesh_errors({"a", "a", "a", "a"}, wrong_shape)) {
    EXPECT_NE(m.find("shape {3, 2} holds 6 ranks but the group has 4"), std::string::npos) << m;
  }
  // Two negative dimensions multiply to the world size: the sign is the fault.
  auto negative = [](ProcessGroup& world) { ProcessMesh mesh(world.shared_from_this(), {-1, -2}); };
  for (const auto& m : mesh_errors({"a", "a"}, negative)) {
    EXPECT_NE(m.find("shape {-1, -2} has a dimension below 1; both dimensions must be positive"),
              std::string::npos)
        << m;
  }
  auto unknown_dim = [](ProcessGroup& world) {
    ProcessMesh mesh(world.shared_from_this(), {2, 1});
    mesh.group("hosts");
  };
  for (const auto& m : mesh_errors({"a", "b"}, unknown_dim)) {
    EXPECT_NE(m.find("'hosts' is not a dimension of this mesh; its dimensions are 'host' (size "
                     "2) and 'local' (size 1)"),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace tandem
