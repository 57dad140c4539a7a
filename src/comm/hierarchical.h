#pragma once
// Hierarchical all-reduce, reduce-scatter and all-gather: for a group whose
// ranks span several hosts with more than one rank on some host.
//
// Inside a host the ranks meet over shared memory (an inner group of the
// host's ranks); between hosts over Gloo (inner groups of one rank per
// host). Two forms, chosen once when the group connects:
//
//   split  (every host holds L ranks): local rank j handles 1/L of the data
//          with its counterparts (local rank j of every host). All-reduce:
//          shm reduce-scatter, Gloo all-reduce of the shard across hosts,
//          shm all-gather. Reduce-scatter: shm reduce-scatter of the chunks
//          of counterpart group j, then a Gloo reduce-scatter across hosts.
//          All-gather: Gloo all-gather across hosts, then shm all-gather.
//   leader (hosts hold different numbers of ranks): the host's lowest rank
//          talks to the other hosts' lowest ranks. All-reduce: shm
//          all-reduce, Gloo all-reduce between leaders, shm broadcast.
//          Reduce-scatter: the same on the whole input, then the leader
//          scatters the chunks. All-gather: shm all-gather, Gloo all-gather
//          between leaders (padded to the largest host), shm broadcast.
//
// Why split whenever it applies: it sends the same bytes between hosts as the
// leader form (each host's share of a ring), but over L connections whose
// reductions run on L cores at once, and its steps inside the host move N
// bytes (reduce-scatter, all-gather) where the leader's move about 2N plus a
// broadcast of N to L - 1 ranks. Measured (docs/comm.md, Hierarchical
// collectives) on namespace hosts of one 2-core machine: a 64 MiB all-reduce
// ran about 1.5x faster than flat Gloo in both forms; the forms themselves
// were within noise there, so the rule rests on the byte counts until a real
// multi-host measurement.
//
// Steps run on a worker thread in submission order, so all_reduce_async
// overlaps the caller's compute and every rank issues the inner collectives
// in the same order. The inner groups check no fingerprints of their own:
// the outer collective was checked once. Each inner step is bounded by the
// group's timeout. Thread-safe.

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "comm/serial_worker.h"
#include "tandem/comm/process_group.h"

namespace tandem::detail {

class ShmTransport;

// Where a group's ranks sit: hosts in order of their lowest rank, each
// host's group ranks ascending. Ranks of a host need not be contiguous.
struct HostLayout {
  std::vector<std::vector<int>> hosts;
  int host = 0;        // this rank's host (index into hosts)
  int local_rank = 0;  // this rank's index in hosts[host]

  // From every rank's host id (ids[r] is group rank r's).
  static HostLayout from_host_ids(const std::vector<std::string>& ids, int rank);
  // More than one host, and a host holding more than one rank.
  bool hierarchical_helps() const;
  // Every host holds as many ranks.
  bool equal_hosts() const;
  // Group ranks of local rank j on every host that has one, ascending: the
  // members of counterpart group j (group 0: the leaders).
  std::vector<int> counterparts(std::size_t j) const;
  // This host's ranks.
  const std::vector<int>& mine() const { return hosts[static_cast<std::size_t>(host)]; }
  int world() const;
};

enum class HierarchicalForm { kLeader, kSplit };

class Hierarchy {
 public:
  // `local`: the group of this host's ranks (`local_shm` its shared-memory
  // transport, null only when it holds one rank); `across`: this rank's
  // counterpart group.
  Hierarchy(HostLayout layout, HierarchicalForm form, std::shared_ptr<ProcessGroup> local,
            ShmTransport* local_shm, std::shared_ptr<ProcessGroup> across);
  Hierarchy(const Hierarchy&) = delete;
  Hierarchy& operator=(const Hierarchy&) = delete;

  HierarchicalForm form() const { return form_; }

  // The split form's all-reduce pipelines pieces of this size (the last
  // smaller), at most kMaxPipelinePieces of them.
  static constexpr std::int64_t kPipelinePieceBytes = std::int64_t{4} << 20;
  static constexpr std::int64_t kMaxPipelinePieces = 16;

  // Queue the collective; the future completes (or holds the error) once the
  // output holds the result. Tensors: contiguous CPU, alive and untouched
  // until then; at least one element. Same contracts as ProcessGroup's.
  std::shared_future<void> all_reduce(at::Tensor tensor, ReduceOp op);
  std::shared_future<void> reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op);
  std::shared_future<void> all_gather(at::Tensor output, at::Tensor input);

 private:

  void run_all_reduce(at::Tensor& tensor, ReduceOp op);
  // The split form's all-reduce of `flat`, in pieces of about
  // kPipelinePieceBytes: piece k crosses hosts (Gloo, on its own thread)
  // while this thread reduces piece k+1 inside the host and gathers k-1.
  void split_all_reduce(at::Tensor& flat, ReduceOp inner);
  void run_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op);
  void run_all_gather(at::Tensor& output, const at::Tensor& input);
  // Within the host: local rank 0's `tensor` to every local rank.
  void local_broadcast(at::Tensor& tensor);
  // Within the host: local rank 0 sends bytes [offsets[j], + bytes) of its
  // `whole` to local rank j's `part`.
  void local_scatter(at::Tensor& part, const at::Tensor& whole);

  HostLayout layout_;
  HierarchicalForm form_;
  int world_;
  std::shared_ptr<ProcessGroup> local_;
  ShmTransport* local_shm_;
  std::shared_ptr<ProcessGroup> across_;
  SerialWorker worker_;  // last: stops before the state its jobs use
};

}  // namespace tandem::detail
