#pragma once
// Transport: what carries a group's collectives and point-to-point messages.
//
// A ProcessGroup chooses its transports once, while it connects, one per kind
// of traffic (TransportRoutes below), the way c10d's ProcessGroup dispatches
// to a Backend chosen once: the collective files number and check a call,
// then hand it to the transport of its kind and never ask which one it is.
//
// Implementations, each in a file of its own:
//   C10dTransport         Gloo, and NCCL for CUDA tensors (c10d_transport.h)
//   OneHostTransport      shared memory, every rank on one host
//   HierarchicalTransport shared memory inside hosts, Gloo across them
//   MailboxTransport      send/recv through shared memory between ranks of
//                         one host
// Each shared-memory transport carries the tensors its kernels handle (CPU,
// dense; the reducing collectives only some dtypes) and hands any other to
// the C10dTransport it was given, so that choice, made per tensor, stays
// inside the transport, as does Gloo's versus NCCL's.
//
// Every rank of a group chooses alike (the choice rests on gathered host ids
// and settings), and every per-tensor choice rests on what the desync check
// holds equal across ranks (device, dtype, shape), so all ranks take the same
// path for every call.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"
#include "tandem/comm/work.h"

namespace tandem::detail {

// A collective being started (ProcessGroup::Impl::begin): its number, its
// description, used in every error ("all_reduce #12 Float[4, 8] on gloo"),
// and what to say about the other ranks should it time out (null while the
// group sets itself up).
struct Call {
  std::uint64_t sequence = 0;
  std::string what;
  std::function<std::string()> explain;
};

// A send or recv being started: its description ("send to rank 1, tag 0,
// Float[4] on shm"), how messages name the peer, and where the peer last was
// should it time out.
struct PeerCall {
  std::string what;
  std::string peer;
  std::function<std::string()> explain;
};

// What an all_to_all moves, in rows of dim 0. Every rank passes the same
// `sent` matrix (row = source: sent[src * world + dst] rows go from src to
// dst); the splits are this rank's. `even`: the equal-split form, whose
// splits c10d takes as empty lists.
struct AllToAllPlan {
  std::vector<std::int64_t> output_splits;
  std::vector<std::int64_t> input_splits;
  std::vector<std::int64_t> sent;
  bool even = false;
};

// Every collective method is called by every rank of the group in the same
// order with matching arguments (the collective files check them first),
// after ProcessGroup::Impl::begin numbered the call; send and recv by the
// two ranks involved. Tensors are dense and contiguous. The synchronous
// methods return once this rank's output holds the result; errors are
// tandem::Error subclasses naming `call.what`. A transport serves only the
// kinds it is routed; the others throw tandem::Error (a routing bug, never a
// user's). Thread-safety: as ProcessGroup's, one caller at a time per group.
class Transport {
 public:
  virtual ~Transport() = default;

  // How a description names this transport for a collective on `tensor`
  // ("shm", "shm+gloo", "gloo", "nccl"); `reduces`: all_reduce and
  // reduce_scatter, which the shared-memory kernels carry for fewer dtypes.
  virtual std::string name(const at::Tensor& tensor, bool reduces) const = 0;
  // The same for a send or recv between this rank and `peer`.
  virtual std::string peer_name(const at::Tensor& tensor, int peer) const {
    (void)peer;
    return name(tensor, /*reduces=*/false);
  }

  // In place; completes asynchronously (Work::wait finishes an average).
  virtual Work all_reduce(at::Tensor tensor, ReduceOp op, const Call& call);
  // `output` (world_size x input.numel() elements, contiguous) gets rank r's
  // `input` at offset r * input.numel(). input.numel() > 0.
  virtual void all_gather(at::Tensor output, const at::Tensor& input, const Call& call);
  // `output` (flat) gets chunk `rank` of the reduction of every rank's
  // `input` (world_size x output.numel() elements). output.numel() > 0.
  virtual void reduce_scatter(at::Tensor output, const at::Tensor& input, ReduceOp op,
                              const Call& call);
  virtual void broadcast(at::Tensor tensor, int root, const Call& call);
  // Root's `whole` (world_size x part, undefined elsewhere) gets rank r's
  // `part` as row r. part.numel() > 0.
  virtual void gather(at::Tensor whole, const at::Tensor& part, int root, const Call& call);
  // `output` gets the root's inputs[rank] (inputs are ignored off the
  // root).
  // output.numel() > 0.
  virtual void scatter(at::Tensor output, const std::vector<at::Tensor>& inputs, int root,
                       const Call& call);
  // Moves the rows `plan` says; some row moves and rows have bytes.
  virtual void all_to_all(at::Tensor output, const at::Tensor& input, const AllToAllPlan& plan,
                          const Call& call);
  virtual void barrier(const Call& call);

  // Point to point; messages of one (peer, tag) match in the order issued.
  // The Work completes once the tensor may be reused (send) or holds the
  // data (recv). `blocking`: the caller waits at once, so the transport may
  // do the waiting on the caller's thread.
  virtual Work send(at::Tensor tensor, int dst, int tag, const PeerCall& call);
  virtual Work recv(at::Tensor tensor, int src, int tag, const PeerCall& call, bool blocking);

 protected:
  // Throws the logic error of a method this transport is not routed.
  [[noreturn]] void not_routed(const char* method) const;
};

// The transport of each kind of traffic, chosen once per group while it
// connects (ProcessGroup::Impl::choose_transports). Not owned.
struct TransportRoutes {
  // all_reduce, reduce_scatter, all_gather(_into) and the gathers inside
  // other calls: shared memory on one host, the hierarchical path across
  // hosts that hold several ranks, else c10d.
  Transport* reduce = nullptr;
  // gather, scatter, all_to_all, and the desync check's small all-reduces:
  // shared memory on one host, else c10d (the hierarchical path has no
  // exchange, and one flat all-reduce of 32 integers beats its three steps).
  Transport* exchange = nullptr;
  // broadcast and barrier: c10d.
  Transport* broadcast = nullptr;
  // send and recv: the mailbox when another rank shares this rank's host,
  // else c10d.
  Transport* point_to_point = nullptr;
};

}  // namespace tandem::detail
