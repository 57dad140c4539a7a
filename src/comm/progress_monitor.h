#pragma once
// ProgressMonitor: where each rank last was, so that a timeout can name the
// ranks that did not arrive instead of only the one that waited.
//
// Each rank records the collective it enters (a mutex and a string copy, no
// I/O). A background thread publishes the latest entry to the store under
// "tandem/progress/<rank>" at most once per interval and only when it
// changed, so the store sees at most a few writes per second per rank. On a
// timeout the waiting rank reads every rank's key with generic c10d::Store
// calls (check, get), which works over HashStore, TCPStore and tandem's store.
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/group_ranks.h"
#include "core/torch_compat.h"

namespace tandem::detail {

class ProgressMonitor {
 public:
  // Publishes "joined" for this rank at once, then starts the publisher.
  // Call before the group's rendezvous, so every key is fresh (a store kept
  // across restarts may hold the previous run's keys). `group` names the
  // ranks in explanations.
  ProgressMonitor(compat::StorePtr store, int rank, int world_size,
                  std::chrono::milliseconds interval, GroupRanks group = {});
  // Stops the publisher; returns within one store call.
  ~ProgressMonitor();
  ProgressMonitor(const ProgressMonitor&) = delete;
  ProgressMonitor& operator=(const ProgressMonitor&) = delete;

  // This rank entered collective `sequence`, described by `what`.
  void entered(std::uint64_t sequence, const std::string& what);
  // This rank started a send or recv (`what`) while `next_sequence`
  // collectives had been issued; published from the first call on, before
  // any collective too, so that a peer's timeout names it ("rank 1 last
  // entered recv from rank 0, tag 6, ..."). It counts as being in the last
  // collective issued (none when next_sequence is 0), and is never taken as
  // a different call of that collective.
  void entered_point_to_point(std::uint64_t next_sequence, const std::string& what);

  // After collective `sequence` timed out on this rank: reads every rank's
  // progress and says who is missing, e.g. "ranks 1, 3 did not arrive (rank 1
  // last entered barrier #9 (as of its last report, 0.4 s ago); rank 3 never
  // reported)", or, when every rank is in it but not in the same call,
  // each rank's call. Never throws.
  std::string explain_timeout(std::uint64_t sequence);

  // After a send or recv with `peer` timed out: where that rank last was,
  // e.g. "rank 2 last entered barrier #9 (as of its last report, 0.4 s
  // ago)". Never throws.
  std::string explain_peer(int peer);

 private:
  void publish_loop();
  void publish_latest();

  compat::StorePtr store_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds interval_;
  GroupRanks group_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool dirty_ = false;
  std::string latest_;  // the value to publish
  std::mutex publish_mutex_;  // one store write at a time, in order
  std::thread publisher_;
};

// The key under which `rank` publishes its progress.
std::string progress_key(int rank);

// Pure part of explain_timeout: `values[r]` is rank r's published value
// ("@<unix ms> " when it was published, then "joined", "<sequence>
// <description>" or "p2p <collectives issued> <description>"), nullopt
// when it has none. Ranks in collective `sequence` whose descriptions differ
// (another operation, shape, dtype, reduce op or root) are named as a desync. `group` names the ranks (group
// ranks index `values`). A value is only what the rank said when it last
// published (a frozen rank says nothing more), so a stamped one's note
// gives its age against `now_unix_ms` (0: the current time).
std::string explain_progress(std::uint64_t sequence, int self,
                             const std::vector<std::optional<std::string>>& values,
                             const GroupRanks& group = {}, std::int64_t now_unix_ms = 0);

}  // namespace tandem::detail
