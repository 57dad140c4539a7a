// Launchers that meet at the store in rounds (--rdzv-backend c10d), each
// node a thread over one in-memory store.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
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

std::vector<int> slot_list(int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(i);
  return out;
}

RendezvousSettings node_settings(int min_nodes, int max_nodes, bool coordinator,
                                 const std::string& host, int processes) {
  RendezvousSettings s;
  s.run_id = "job";
  s.min_nodes = min_nodes;
  s.max_nodes = max_nodes;
  s.coordinator = coordinator;
  s.host = host;
  s.slots = slot_list(processes);
  s.join_timeout = milliseconds(20000);
  s.last_call = milliseconds(300);
  s.poll = milliseconds(5);
  return s;
}

// HashStore whose add() also wakes wait(): c10d's HashStore notifies
// waiters only on set(), so after each add this sets "<key>/added", which a
// test blocks on to learn that another thread reached that step.
class AddNotifyingStore : public c10d::HashStore {
 public:
  int64_t add(const std::string& key, int64_t value) override {
    const int64_t total = c10d::HashStore::add(key, value);
    c10d::HashStore::set(key + "/added", std::vector<uint8_t>{1});
    return total;
  }
};

// Blocks until `key` exists (another thread's step), for at most 20 s.
void wait_key(c10d::Store& store, const std::string& key) {
  store.wait({key}, std::chrono::seconds(20));
}

TEST(NodeRendezvous, TheCoordinatorIsNodeZeroAndEveryNodeAgreesOnTheWorld) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::vector<int> counts = {2, 1, 3};  // node i's processes
  std::vector<Round> rounds(3);
  std::vector<std::thread> nodes;
  // The others arrive first: the coordinator is node 0 whenever it comes.
  for (int i : {1, 2, 0}) {
    if (i == 0) wait_key(*store, "tandem/rdzv/job/r0/node2");
    nodes.emplace_back([&, i] {
      NodeRendezvous node(*store, node_settings(3, 3, i == 0, "h" + std::to_string(i), counts[i]));
      EXPECT_TRUE(node.join(rounds[i]));
    });
    if (i == 1) wait_key(*store, "tandem/rdzv/job/r0/node1");
  }
  for (auto& t : nodes) t.join();
  EXPECT_EQ(rounds[0].layout.node_rank, 0);
  EXPECT_EQ(rounds[1].layout.node_rank, 1);
  EXPECT_EQ(rounds[2].layout.node_rank, 2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rounds[i].number, 0);
    EXPECT_EQ(rounds[i].layout.world_size, 6) << "every node computes the same world";
    EXPECT_EQ(rounds[i].first_world, 6);
    EXPECT_EQ(rounds[i].members.size(), 3u);
    EXPECT_EQ(rounds[i].layout.slots, slot_list(counts[i]));
  }
  // Offsets follow node ranks: each node starts where the ones before end.
  EXPECT_EQ(rounds[0].layout.rank_offset, 0);
  EXPECT_EQ(rounds[1].layout.rank_offset, 2);
  EXPECT_EQ(rounds[2].layout.rank_offset, 3);
}

TEST(NodeRendezvous, ANodeTooManyForAFixedJobIsRefusedWithTheFix) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  Round a, b;
  std::thread host([&] { NodeRendezvous(*store, node_settings(2, 2, true, "h0", 1)).join(a); });
  NodeRendezvous(*store, node_settings(2, 2, false, "h1", 1)).join(b);
  host.join();
  try {
    Round c;
    NodeRendezvous(*store, node_settings(2, 2, false, "h2", 1)).join(c);
    FAIL() << "a third node joined a job of two";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("already has its 2 nodes"), std::string::npos) << what;
    EXPECT_NE(what.find("--rdzv-id"), std::string::npos) << what;
  }
}

TEST(NodeRendezvous, AnElasticRoundClosesAtMinAfterTheLastCallAndALateNodeJoinsTheNext) {
  auto store = c10::make_intrusive<AddNotifyingStore>();
  NodeRendezvous coordinator(*store, node_settings(2, 3, true, "h0", 1));
  NodeRendezvous second(*store, node_settings(2, 3, false, "h1", 2));
  Round r0, r1;
  std::thread t([&] { EXPECT_TRUE(second.join(r1)); });
  ASSERT_TRUE(coordinator.join(r0));
  t.join();
  EXPECT_EQ(r0.members.size(), 2u) << "closed with MIN nodes after the last call";
  EXPECT_EQ(r0.layout.world_size, 3);
  EXPECT_EQ(coordinator.check(r0), "");
  // A third node arrives while round 0 runs: it waits; the coordinator's
  // next look moves the job to round 1, a membership change.
  NodeRendezvous late(*store, node_settings(2, 3, false, "h2", 1));
  Round late_round;
  std::thread t3([&] { EXPECT_TRUE(late.join(late_round)); });
  wait_key(*store, "tandem/rdzv/job/r0/waiting/added");
  const std::string why = coordinator.check(r0);
  EXPECT_NE(why.find("a node waits to join"), std::string::npos) << "[" << why << "]";
  EXPECT_NE(second.check(r1).find("moved to round 1"), std::string::npos);
  Round c1, s1;
  std::thread t2([&] { EXPECT_TRUE(second.join(s1)); });
  ASSERT_TRUE(coordinator.join(c1));
  t2.join();
  t3.join();
  EXPECT_EQ(c1.number, 1);
  EXPECT_EQ(c1.members.size(), 3u) << "MAX joined: closed at once";
  EXPECT_EQ(late_round.layout.world_size, 4);
  EXPECT_EQ(late_round.first_world, 3) << "round 0's world, for --keep-global-batch";
  EXPECT_EQ(store->add("tandem/rdzv/job/restarts", 0), 0) << "a membership change is free";
}

TEST(NodeRendezvous, AFailureMovesEveryNodeOnOnceAndTheBudgetStopsTheJob) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  NodeRendezvous coordinator(*store, node_settings(2, 2, true, "h0", 1));
  NodeRendezvous other(*store, node_settings(2, 2, false, "h1", 1));
  Round c0, o0;
  std::thread t([&] { other.join(o0); });
  coordinator.join(c0);
  t.join();
  // Both nodes' workers fail for one cause: one restart is counted.
  EXPECT_TRUE(other.restart_after_failure(o0, "rank 1 exited with code 3", 1));
  EXPECT_TRUE(coordinator.restart_after_failure(c0, "rank 0 exited with code 1", 1));
  EXPECT_EQ(store->add("tandem/rdzv/job/restarts", 0), 1);
  const std::string why = coordinator.check(c0);
  EXPECT_NE(why.find("rank 1 exited with code 3 (host h1)"), std::string::npos) << why;
  Round c1, o1;
  std::thread t2([&] { other.join(o1); });
  coordinator.join(c1);
  t2.join();
  EXPECT_EQ(c1.number, 1);
  // The second failure is past --max-restarts 1: every node stops.
  EXPECT_FALSE(coordinator.restart_after_failure(c1, "rank 0 exited with code 1", 1));
  EXPECT_NE(other.check(o1).find("the restart budget is spent (--max-restarts 1)"),
            std::string::npos);
  Round next;
  EXPECT_THROW(other.join(next), Error);
}

TEST(NodeRendezvous, TooFewNodesTimeOutAndStopTheOthers) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto settings = node_settings(3, 3, true, "h0", 1);
  settings.join_timeout = milliseconds(500);
  NodeRendezvous coordinator(*store, settings);
  NodeRendezvous other(*store, node_settings(3, 3, false, "h1", 1));
  std::atomic<bool> other_stopped{false};
  std::thread t([&] {
    Round r;
    try {
      other.join(r);
    } catch (const Error& e) {
      other_stopped = std::string(e.what()).find("2 of the 3 nodes") != std::string::npos;
    }
  });
  Round r;
  try {
    coordinator.join(r);
    FAIL() << "the round closed with a node missing";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 of the 3 nodes --nnodes needs joined within 0.5 s"), std::string::npos)
        << what;
    EXPECT_NE(what.find("--rdzv-timeout"), std::string::npos) << what;
  }
  t.join();
  EXPECT_TRUE(other_stopped) << "the waiting node learns why the job stopped";
}

TEST(NodeRendezvous, WhoLeftNamesTheNodeItsHostAndRanks) {
  Round before, after;
  before.members = {{0, 2, "h0"}, {1, 2, "h1"}, {2, 1, "h2"}};
  after.members = {{0, 2, "h0"}, {1, 2, "h2"}};
  EXPECT_EQ(NodeRendezvous::who_left(before, after), "node 1 (host h1, ranks 2-3)");
  after.members = {{0, 2, "h0"}, {1, 2, "h1"}};
  EXPECT_EQ(NodeRendezvous::who_left(before, after), "node 2 (host h2, rank 4)");
  EXPECT_EQ(NodeRendezvous::who_left(Round{}, after), "");
}

TEST(NodeRendezvous, TheCoordinatorWaitsForEveryNodeToFinishAndALateNodeThenExits) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  NodeRendezvous coordinator(*store, node_settings(2, 3, true, "h0", 1));
  NodeRendezvous other(*store, node_settings(2, 3, false, "h1", 1));
  Round c0, o0;
  std::thread t([&] { other.join(o0); });
  coordinator.join(c0);
  t.join();
  std::atomic<bool> coordinator_done{false};
  std::thread exit_barrier([&] {
    EXPECT_TRUE(coordinator.finish(c0, milliseconds(20000)));
    coordinator_done = true;
  });
  EXPECT_FALSE(store->check({"tandem/rdzv/job/done"})) << "finished before the other node";
  EXPECT_TRUE(other.finish(o0, milliseconds(20000)));
  exit_barrier.join();
  EXPECT_TRUE(coordinator_done);
  Round late;
  EXPECT_FALSE(NodeRendezvous(*store, node_settings(2, 3, false, "h2", 1)).join(late))
      << "the job finished without the late node";
}

}  // namespace
}  // namespace tandem::cli
