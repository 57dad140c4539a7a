#pragma once
// ProcessGroup: tandem's handle on the job's ranks and their collectives.
//
// Built on c10d: a store rendezvous (tandem's token-checked store, or a
// foreign launcher's c10d TCPStore), Gloo for CPU tensors and NCCL for
// CUDA tensors when LibTorch has it. Every collective has a timeout; at world
// size 1 (no launcher) nothing is created and every collective is a no-op or
// a local copy.
//
// CPU collectives: shared memory when every rank of the group is on one
// host; when the ranks span hosts and some host holds several of them,
// all-reduce, reduce-scatter and all-gather are hierarchical (shared memory
// inside each host, Gloo between hosts; ProcessGroupOptions::hierarchical);
// everything else goes over one flat Gloo group of all the ranks.
//
// Subgroups: new_group() and split_group() make groups of some of the ranks
// (as torch.distributed.new_group), each with its own numbering, timeouts,
// desync check and transport (shared memory when all its ranks share a host,
// hierarchical or Gloo otherwise); ProcessMesh (mesh.h) builds the host x
// local-rank groups.
// Ranks passed to and returned by a group's methods are that group's ranks;
// errors name both, e.g. "rank 3 (rank 1 of group [1, 3])".
//
// Thread-safety: a ProcessGroup may be used from one thread at a time, and
// every rank must issue the same collectives in the same order (as in c10d);
// the desync check (ProcessGroupOptions) catches a rank that does not.
// Different ProcessGroup objects are independent: a subgroup may be used from
// another thread than its parent. send/recv are not collectives: only the
// two ranks involved call them.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "tandem/comm/work.h"
#include "tandem/core/rank_env.h"

namespace c10d {
class Store;
}

namespace tandem {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

const char* to_string(ReduceOp op);

// Which backend carries collectives on CUDA tensors. CPU tensors always use
// Gloo. kAuto picks NCCL when LibTorch was built with it, Gloo otherwise.
enum class CudaBackend { kAuto, kNccl, kGloo };

// Parses "auto", "nccl" or "gloo"; throws UsageError otherwise.
CudaBackend parse_cuda_backend(const std::string& text);

// Whether CPU all-reduces, reduce-scatters and all-gathers of a group whose
// ranks span hosts go hierarchically (docs/comm.md, Hierarchical
// collectives). kAuto: when the group spans hosts and a host holds more than
// one of its ranks, the split form when every host holds as many ranks,
// else the leader form. kOff: one flat Gloo group. kLeader / kSplit force a
// form where hierarchical applies (benchmarks); kSplit with hosts holding
// different numbers of ranks is a UsageError when the group connects.
enum class Hierarchical { kAuto, kOff, kLeader, kSplit };

// Parses "auto", "off", "leader" or "split" (also "1" = auto, "0" = off);
// throws UsageError otherwise.
Hierarchical parse_hierarchical(const std::string& text);
const char* to_string(Hierarchical mode);

struct ProcessGroupOptions {
  CudaBackend cuda_backend = CudaBackend::kAuto;
  // Limit for every collective and for the rendezvous (init() takes
  // TANDEM_TIMEOUT_S over it). A collective that times out throws
  // TimeoutError naming the ranks that did not arrive and where they last
  // were, read from the progress every rank publishes to the store.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // The first this many collectives of the group (counted by sequence
  // number) compare a fingerprint (operation, sequence number, dtype, shape,
  // reduce op, root) across ranks before they run; a mismatch throws
  // UsageError naming the ranks and what each called. Covers the first
  // iterations of training, where a desync usually shows. Costs one small
  // all-reduce per checked collective. 0 turns the check off.
  std::uint64_t desync_check_collectives = 256;
  // Check every collective, not only the first ones (init() sets it from
  // TANDEM_DEBUG=DETAIL or TORCH_DISTRIBUTED_DEBUG=DETAIL). Every rank must
  // agree on it.
  bool debug_detail = false;
  // Longest delay before a rank's progress reaches the store (it is written
  // only when it changed, so collectives never wait on the store).
  std::chrono::milliseconds progress_interval = std::chrono::milliseconds(500);
  // Address Gloo listens on. Empty: derived from RankEnv (interface, or the
  // local address that routes to MASTER_ADDR).
  std::string gloo_host;
  // Network interface Gloo listens on (e.g. "eth0"); wins over gloo_host.
  std::string gloo_interface;
  // When every rank of a group is on one host, carry its CPU all-reduces,
  // all-gathers, reduce-scatters, all-to-alls, gathers and scatters through
  // shared memory instead of Gloo's loopback TCP (several times faster).
  // false forces Gloo (and the flat path across hosts). Subgroups decide for
  // themselves.
  bool shared_memory = true;
  // Ranks with equal host ids share memory. Empty: hostname and boot id.
  std::string host_id;
  // Hierarchical collectives across hosts (init() takes TANDEM_HIERARCHICAL
  // over it). Needs shared_memory. Every rank of a group must agree on it
  // and on shared_memory: the group refuses to connect otherwise, naming the
  // ranks. Subgroups inherit it and decide for themselves.
  Hierarchical hierarchical = Hierarchical::kAuto;
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // Joins the job that `env` describes, rendezvousing through the store at
  // MASTER_ADDR:MASTER_PORT (hosted by rank 0 unless the launcher hosts it):
  // tandem's own with TANDEM_STORE_TOKEN, else torchrun's c10d TCPStore.
  // A process with no launcher environment gets a local world of 1.
  // Throws CommError/TimeoutError with the address and the likely fix.
  static std::shared_ptr<ProcessGroup> init(const RankEnv& env,
                                            const ProcessGroupOptions& options = {});

  // Joins through an existing store; tests use a c10d::HashStore to run
  // ranks as threads. Blocks until all `world_size` ranks have joined.
  static std::shared_ptr<ProcessGroup> create(c10::intrusive_ptr<c10d::Store> store, int rank,
                                              int world_size,
                                              const ProcessGroupOptions& options = {});

  // World of 1 with no store and no backend.
  static std::shared_ptr<ProcessGroup> local();

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // This rank's rank in the group; -1 on a rank outside it (a handle that
  // new_group returned to a non-member).
  int rank() const;
  // Number of ranks in the group.
  int world_size() const;
  std::chrono::milliseconds timeout() const;
  // Name of the backend for CPU tensors: "gloo", or "local" at world 1.
  std::string backend_name() const;
  // True when CPU all-reduces, all-gathers, reduce-scatters, all-to-alls,
  // gathers and scatters go through the shared-memory transport.
  bool uses_shared_memory() const;
  // Id of this rank's host (ProcessGroupOptions::host_id, else hostname and
  // boot id): ranks with equal ids share memory.
  std::string host_id() const;
  // Every rank's host_id(), by group rank: gathered when the group
  // connected, so asking needs no communication. A rank is its host's local
  // main when no lower rank has its id. Empty on a non-member handle.
  std::vector<std::string> host_ids() const;
  // True when CPU all-reduces, reduce-scatters and all-gathers (of dtypes the
  // shared-memory kernels reduce; all-gathers of any dtype) take the
  // hierarchical path: the ranks span hosts, a host holds more than one of
  // them, and ProcessGroupOptions::hierarchical is not kOff. Fixed when the
  // group connects; every rank of the group answers alike.
  bool uses_hierarchical() const;
  // "split", "leader", or "" when uses_hierarchical() is false.
  std::string hierarchical_form() const;

  // ---- subgroups ----

  // Makes a group of `ranks` (ranks of this group; any order, no repeats;
  // group rank g is the g-th smallest, as in torch.distributed.new_group).
  // Collective over this group: every rank calls it with the same list,
  // also the ranks outside it, which get a handle whose every collective
  // throws UsageError naming the members (check is_member()). Counts once in
  // sequence_number(). The subgroup shares this group's options, store and
  // Gloo device, and uses shared memory when all its ranks share a host. It
  // may outlive this handle. Throws UsageError when the ranks disagree on the
  // list or it is invalid, CommError/TimeoutError when its ranks cannot meet.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);
  // Makes disjoint groups at once and returns the one this rank is in (a
  // non-member handle when none holds it), as torch's split_group: one
  // collective over this group however many groups are made. Same contract
  // as new_group.
  std::shared_ptr<ProcessGroup> split_group(std::vector<std::vector<int>> groups);
  // False on a handle that new_group or split_group returned to a rank
  // outside the group.
  bool is_member() const;
  // Global ranks (of the job's world group) of this group's members, by group
  // rank. For the world group 0..world_size-1.
  std::vector<int> global_ranks() const;

  // In-place reduction of `tensor` across ranks. kAvg needs a floating type.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Starts the same reduction; the tensor must stay alive and untouched until
  // Work::wait() returns.
  Work all_reduce_async(at::Tensor tensor, ReduceOp op = ReduceOp::kSum);

  // Overwrites `tensor` on every rank with root's.
  void broadcast(at::Tensor& tensor, int root = 0);

  // Returns world_size tensors, entry r being rank r's `tensor`. Every rank
  // must pass the same shape and dtype.
  std::vector<at::Tensor> all_gather(const at::Tensor& tensor);

  // Gathers into one contiguous `output` of world_size * input.numel()
  // elements, rank r's input at offset r * input.numel(). Same dtype and
  // device for both.
  void all_gather_into(at::Tensor& output, const at::Tensor& input);

  // Reduces `input` (world_size * output.numel() elements) across ranks and
  // leaves this rank's chunk r in `output`, reduced as all_reduce reduces.
  // On one host CPU tensors go through shared memory; across hosts
  // hierarchically (uses_hierarchical()), else over Gloo, which has no
  // reduce-scatter in c10d: tandem uses an all-to-all plus a local
  // reduction, which moves the same bytes as a ring reduce-scatter.
  void reduce_scatter(at::Tensor& output, const at::Tensor& input,
                      ReduceOp op = ReduceOp::kSum);

  void barrier();

  // ---- exchanges ----

  // Equal splits (torch's all_to_all_single without split sizes): input's
  // dim 0 is cut into world_size equal blocks, block r going to rank r;
  // output's block r comes from rank r. Both have the same shape, dtype and
  // device, and dim 0 must divide by world_size. Input and output must not
  // overlap. Shared memory on one host (CPU), else Gloo (NCCL for CUDA).
  void all_to_all(at::Tensor& output, const at::Tensor& input);
  // Uneven splits (all_to_all_single with split sizes): input_splits[r]
  // rows (dim 0) of input, in order, go to rank r; output_splits[r] rows of
  // output arrive from rank r. Zero is allowed. Splits sum to the tensors'
  // dim 0, the other dims agree. Every rank's input_splits[r] must equal rank
  // r's output_splits[this rank]: the ranks exchange their splits first (one
  // small all-gather) and throw UsageError naming the pair that disagrees,
  // instead of corrupting memory or hanging. Counted once.
  void all_to_all(at::Tensor& output, const at::Tensor& input,
                  const std::vector<std::int64_t>& output_splits,
                  const std::vector<std::int64_t>& input_splits);

  // Rank `root` gets every rank's `tensor` (same shape and dtype on every
  // rank), indexed by rank; the other ranks get an empty vector.
  std::vector<at::Tensor> gather(const at::Tensor& tensor, int root = 0);
  // Rank r's `output` gets root's inputs[r]. On root, `inputs` holds
  // world_size tensors of output's shape, dtype and device; on the other
  // ranks it is ignored (pass {}).
  void scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int root = 0);

  // ---- point to point ----
  //
  // Not collectives: only the sender and the receiver call them, so they
  // neither count in sequence_number() nor take part in the desync check.
  // Each send matches the recv from the same rank with the same tag, in
  // order. A small header travels before the data, so a recv whose tensor
  // disagrees with what was sent (dtype or element count; the shape may
  // differ) throws UsageError naming both, instead of truncating or
  // overrunning it. Between two ranks of one host, CPU tensors go through a
  // shared-memory channel per (sender, receiver, tag), unless
  // ProcessGroupOptions::shared_memory is off; otherwise Gloo (NCCL for CUDA
  // data). tag: 0 <= tag < 2^30. A timeout names the peer and where it last
  // was.

  // Returns once `tensor` may be reused: the receiver has taken it (Gloo),
  // or every byte is in the shared-memory channel.
  void send(const at::Tensor& tensor, int dst, int tag = 0);
  // Fills `tensor` (contiguous, of the sent dtype and element count).
  void recv(at::Tensor& tensor, int src, int tag = 0);
  // Start the same; the tensor must stay alive and untouched until
  // Work::wait() returns. Any number may be outstanding; a recv_async waits
  // for its header on a helper thread of its own (on shared memory, each
  // (peer, tag, direction) has its own thread), so that independent messages
  // never wait for each other.
  Work send_async(at::Tensor tensor, int dst, int tag = 0);
  Work recv_async(at::Tensor tensor, int src, int tag = 0);

  // Every rank's bytes / string, indexed by rank. Sizes may differ per rank.
  std::vector<std::vector<std::uint8_t>> all_gather_bytes(const std::vector<std::uint8_t>& bytes);
  std::vector<std::string> all_gather_strings(const std::string& text);

  // Number of collectives issued so far (the next one's sequence number).
  // Each collective above counts once, also when it moves no data (empty
  // tensors) and the byte/string gathers, which run two inner gathers;
  // send and recv do not count.
  std::uint64_t sequence_number() const;

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  // Connects the ranks of a prepared Impl (store, ranks, options): Gloo,
  // progress, shared memory. Shared by create() and the subgroups.
  static std::shared_ptr<ProcessGroup> connect(std::unique_ptr<Impl> impl);
  // new_group (`op`) and split_group.
  // `child_options`, when given, replaces this group's options in the
  // subgroup (the hierarchical path's inner groups check no fingerprints).
  std::shared_ptr<ProcessGroup> make_subgroup(const char* op,
                                              std::vector<std::vector<int>> groups,
                                              const ProcessGroupOptions* child_options = nullptr);
  // Collective steps of connect(), on every rank's host id.
  void setup_shared_memory(const std::vector<std::string>& hosts);
  void setup_hierarchy(const std::vector<std::string>& hosts);
  std::unique_ptr<Impl> impl_;
};

// Overwrites every tensor of `tensors` on every rank with rank `root`'s, with
// one broadcast per dtype and device (the tensors are flattened into one
// buffer). Collective; tensors may be parameters (no autograd is recorded).
void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root = 0);

}  // namespace tandem
