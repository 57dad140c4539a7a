// Launchers that agree on node ranks at the store (--rdzv-backend c10d),
// each node a thread over one in-memory store.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "launch/node_rendezvous.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

using std::chrono::milliseconds;

std::vector<int> slots(int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(i);
  return out;
}

TEST(NodeRendezvous, TheHostIsNodeZeroAndEveryNodeAgreesOnTheWorld) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::vector<int> counts = {2, 1, 3};  // node i's processes, by arrival
  std::vector<NodeLayout> layouts(3);
  std::vector<std::thread> nodes;
  // The non-hosts arrive first (the host starts once both have published
  // their counts): the host is node 0 whenever it comes.
  for (int i : {1, 2, 0}) {
    if (i == 0) store->wait({"tandem/rdzv/job/slots/1", "tandem/rdzv/job/slots/2"});
    nodes.emplace_back([&, i] {
      layouts[i] = rendezvous_nodes(*store, "job", 3, /*hosts_store=*/i == 0, slots(counts[i]),
                                    milliseconds(20000));
    });
  }
  for (auto& t : nodes) t.join();
  EXPECT_EQ(layouts[0].node_rank, 0);
  std::vector<int> seen;
  for (const auto& layout : layouts) {
    EXPECT_EQ(layout.world_size, 6) << "every node computes the same world";
    seen.push_back(layout.node_rank);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  // Offsets follow node ranks: each node starts where the ones before end.
  std::vector<int> count_of_rank(3), offset_of_rank(3);
  for (int i = 0; i < 3; ++i) {
    count_of_rank[layouts[i].node_rank] = counts[i];
    offset_of_rank[layouts[i].node_rank] = layouts[i].rank_offset;
    EXPECT_EQ(layouts[i].slots, slots(counts[i]));
  }
  EXPECT_EQ(offset_of_rank[0], 0);
  EXPECT_EQ(offset_of_rank[1], count_of_rank[0]);
  EXPECT_EQ(offset_of_rank[2], count_of_rank[0] + count_of_rank[1]);
}

TEST(NodeRendezvous, ANodeTooManyIsRefusedWithTheFix) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::thread host([&] { rendezvous_nodes(*store, "job", 2, true, slots(1), milliseconds(20000)); });
  std::thread other(
      [&] { rendezvous_nodes(*store, "job", 2, false, slots(1), milliseconds(20000)); });
  host.join();
  other.join();
  try {
    rendezvous_nodes(*store, "job", 2, false, slots(1), milliseconds(2000));
    FAIL() << "a third node joined a job of two";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("already has its 2 nodes"), std::string::npos) << what;
    EXPECT_NE(what.find("--rdzv-id"), std::string::npos) << what;
  }
  // Another job id meets apart on the same store.
  std::thread fresh([&] { rendezvous_nodes(*store, "job2", 2, true, slots(1), milliseconds(20000)); });
  NodeLayout late = rendezvous_nodes(*store, "job2", 2, false, slots(2), milliseconds(20000));
  fresh.join();
  EXPECT_EQ(late.node_rank, 1);
  EXPECT_EQ(late.world_size, 3);
}

TEST(NodeRendezvous, MissingNodesTimeOutSayingHowManyArrived) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::thread other(
      [&] { EXPECT_THROW(rendezvous_nodes(*store, "job", 3, false, slots(1), milliseconds(1000)),
                         TimeoutError); });
  try {
    rendezvous_nodes(*store, "job", 3, true, slots(1), milliseconds(1000));
    FAIL() << "the rendezvous finished with a node missing";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 of 3 nodes arrived within 1 s"), std::string::npos) << what;
    EXPECT_NE(what.find("--rdzv-timeout"), std::string::npos) << what;
  }
  other.join();
}

}  // namespace
}  // namespace tandem::cli
