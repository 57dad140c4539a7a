#pragma once
// Nodes that meet at the store, as torchrun's `--rdzv-backend c10d` lets
// them: no --node-rank on any node, MIN:MAX nodes, and restarts that every
// node takes together.
//
// The job runs in rounds. Round r is one start of every member's workers
// (TANDEM_RESTART_COUNT = r). The node that hosts the store (the
// coordinator, node 0) closes each round once MIN nodes have joined and
// either MAX have or no other arrived for the last call; the others take
// node ranks 1, 2, ... in the order they join. A round ends for everyone
// when any member moves the job to the next one: its workers failed (a
// restart, counted for the whole job against --max-restarts), or, on the
// coordinator, a node waits to join a job below MAX (a membership change,
// not counted). A node that arrives while a round runs waits for the next.
//
// Store keys, under tandem/rdzv/<id>/: round (the current round), r<N>/joined
// (arrival counter), r<N>/node<K> ("<processes> <host>"), r<N>/closed (the
// member count), r<N>/waiting, r<N>/why (what ended it), r<N>/finished<K>,
// restarts, first_world, failed (why the job stopped).

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "launch/host_filter.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace tandem::cli {

struct RoundMember {
  int node_rank = 0;
  int processes = 0;
  std::string host;
};

struct Round {
  int number = 0;      // the attempt: TANDEM_RESTART_COUNT
  NodeLayout layout;   // this node's node rank, rank offset and slots, and the world size
  std::vector<RoundMember> members;  // by node rank
  int first_world = 0;  // the world size of round 0 (--keep-global-batch)
};

struct RendezvousSettings {
  std::string run_id;
  int min_nodes = 1;
  int max_nodes = 1;
  bool coordinator = false;  // this node hosts the store
  std::string host;          // this node's name, for other nodes' messages
  std::vector<int> slots;    // this node's processes
  std::chrono::milliseconds join_timeout{600000};  // --rdzv-timeout
  std::chrono::milliseconds last_call{30000};      // --rdzv-conf last_call_timeout
  std::chrono::milliseconds poll{100};
  // A member whose heartbeat (written at each check()) has not moved for
  // this long is lost: the coordinator restarts the job without it.
  // torchrun's keep_alive_interval x keep_alive_max_attempt.
  std::chrono::milliseconds keep_alive{15000};
  // Called at each poll while this node waits (to join, to close a round,
  // for the others to finish); what it throws ends the wait (a signal that
  // stops the launcher).
  std::function<void()> on_wait;
};

class NodeRendezvous {
 public:
  NodeRendezvous(c10d::Store& store, RendezvousSettings settings);

  // Joins the next round and returns once it has closed with this node in
  // it; a node that arrives while a round runs (or past MAX) waits for the
  // next. Returns false when the job finished without this node. Throws
  // UsageError when a fixed-size job already has its nodes, TimeoutError
  // when fewer than MIN nodes join within the join timeout, Error when
  // another node stopped the job (the `failed` key's reason).
  bool join(Round& round);

  // While `round` runs: writes this node's heartbeat; returns "" to go on,
  // else why this node's workers must stop: another node moved the job to
  // the next round, or stopped it; or, on the coordinator, a node waits to
  // join (not counted) or a member's heartbeat stopped (a restart, counted).
  // Never throws: a store that cannot be reached gives its reason and sets
  // store_lost().
  std::string check(const Round& round);
  bool store_lost() const { return store_lost_; }

  // --max-restarts, which the restart for a lost member counts against.
  void set_max_restarts(int max_restarts) { max_restarts_ = max_restarts; }

  // This node's workers failed in `round` (`what` says how). Moves the job
  // to the next round and counts a restart, unless another member moved it
  // first. Returns false (and stops every node) when that restart would
  // exceed `max_restarts`.
  bool restart_after_failure(const Round& round, const std::string& what, int max_restarts);

  // This node's workers finished. The coordinator then waits until every
  // member has (the store must outlive their last use of it); returns false
  // when the job moved to another round meanwhile, which this node must
  // join again.
  bool finish(const Round& round, std::chrono::milliseconds exit_barrier);

  // Who of `before` is not in `after` (by host): "node 2 (host h3, ranks
  // 4-5)", comma-separated; "" when nobody left.
  static std::string who_left(const Round& before, const Round& after);

 private:
  std::string key(const std::string& name) const;
  std::string round_key(int round, const std::string& name) const;
  void pause();  // on_wait, then one poll interval
  int current_round();
  void throw_if_failed();
  int close_round(int round);
  void read_members(int round, int members, int this_rank, Round& out);
  bool move_on(int round, const std::string& why, bool counted, int max_restarts);
  std::string lost_member(const Round& round);

  c10d::Store& store_;
  RendezvousSettings settings_;
  bool store_lost_ = false;
  int max_restarts_ = 0;
  // The coordinator's view of each member's heartbeat in the running round.
  int beats_round_ = -1;
  std::vector<int64_t> beats_;
  std::vector<std::chrono::steady_clock::time_point> beats_seen_;
};

}  // namespace tandem::cli
