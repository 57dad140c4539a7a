#pragma once
// Private state of tandem::ProcessGroup.

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/collective_fingerprint.h"
#include "comm/group_ranks.h"
#include "comm/hierarchical.h"
#include "comm/progress_monitor.h"
#include "comm/shm_mailbox.h"
#include "comm/shm_transport.h"
#include "core/torch_compat.h"
#include "tandem/comm/process_group.h"

namespace tandem {

struct ProcessGroup::Impl {
  int rank = 0;
  int world_size = 1;
  ProcessGroupOptions options;
  // Global ranks of the members, and how messages name them.
  detail::GroupRanks group;
  // Non-empty on a handle held by a rank outside the group: the error every
  // collective throws (what, which ranks are in the group, how to fix).
  std::string outside;
  compat::StorePtr store;
  // Gloo's network device, shared with the subgroups made from this group.
  std::shared_ptr<::gloo::transport::Device> device;
  c10::intrusive_ptr<compat::BackendBase> gloo;
  c10::intrusive_ptr<compat::BackendBase> nccl;  // created on first CUDA collective
  std::unique_ptr<detail::ShmTransport> shm;  // all ranks on one host
  // Host id of each rank, by group rank (empty when shared memory is off).
  std::vector<std::string> host_of_rank;
  // send/recv between ranks of one host; null when no other rank shares
  // this rank's host or shared memory is off.
  std::unique_ptr<detail::ShmMailbox> mailbox;
  // Ranks on several hosts, some host holding more than one: the inner
  // groups and worker of the hierarchical collectives (hierarchical.h).
  std::unique_ptr<detail::Hierarchy> hier;
  // Destroyed first (declared last): its thread writes to `store`.
  // Shared with Work handles, which ask it to explain a timeout.
  std::shared_ptr<detail::ProgressMonitor> monitor;
  std::uint64_t sequence = 0;
  // While the group sets itself up, its collectives are neither recorded nor
  // checked; the caller's numbering starts after.
  bool setting_up = true;
  // Subgroups made so far: the next one's store prefix. Every rank of this
  // group counts them alike, since new_group is collective.
  std::uint64_t subgroups_made = 0;
  // Point to point: for each (source rank, tag), when the last recv issued
  // has posted its data receive. Data receives of one (source, tag) are
  // posted in the order the recvs were issued (point_to_point.cpp).
  std::mutex recv_order_mutex;
  std::map<std::pair<int, int>, std::shared_future<void>> recv_posted;

  // A collective being started: its number and its description.
  struct Call {
    std::uint64_t sequence = 0;
    std::string what;
  };

  bool is_local() const { return !gloo; }

  // Throws the UsageError of `outside` on a rank outside the group; `op`
  // names the call.
  void require_member(const char* op) const;

  // Backend for collectives on `tensor`'s device.
  compat::BackendBase& backend_for(const at::Tensor& tensor);
  bool uses_nccl(const at::Tensor& tensor) const;

  // Starts collective number `sequence` (and advances it): records it with
  // the progress monitor and, for the first options.desync_check_collectives
  // collectives or in debug mode, compares its fingerprint across ranks
  // (throws UsageError on a mismatch). Returns its description, used in
  // every error message: "all_reduce #12 Float[4, 8] on gloo", with " in
  // group [1, 3]" on a subgroup. With `rows_vary` (uneven all_to_all) the
  // fingerprint leaves dim 0 out, since it differs between ranks by design.
  Call begin(detail::CollectiveOp op, const at::Tensor* tensor, const std::string& backend,
             std::int64_t reduce_op = -1, std::int64_t root = -1, bool rows_vary = false);

  // Name of the backend that carries collectives on `tensor` ("gloo",
  // "nccl"), without creating it.
  std::string backend_name_for(const at::Tensor& tensor) const;

  // The timeout c10d is given for a collective on `tensor`: tandem's, and a
  // minute more for NCCL, whose watchdog must not end the process before
  // tandem's own deadline reports the collective (work.cpp).
  std::chrono::milliseconds backend_timeout(const at::Tensor& tensor) const {
    return uses_nccl(tensor) ? options.timeout + std::chrono::minutes(1) : options.timeout;
  }

  // What to say about the other ranks when collective `sequence` times out;
  // null while setting up.
  std::function<std::string()> timeout_explainer(std::uint64_t sequence) const;

  // Wraps a c10d call that returns Work, translating synchronous errors.
  template <typename Fn>
  Work launch(const Call& call, Fn&& fn, std::function<void()> on_complete = nullptr) {
    compat::WorkPtr work;
    try {
      work = fn();
    } catch (...) {
      rethrow_usage(call.what);
    }
    return Work(std::move(work), options.timeout, call.what, std::move(on_complete),
                timeout_explainer(call.sequence));
  }

  [[noreturn]] static void rethrow_usage(const std::string& what);

  // Every rank's bytes, indexed by rank: the inner gathers of a collective
  // already begun as `call` (all_gather_bytes, new_group, the split sizes of
  // an uneven all_to_all). Not counted or checked again. collectives.cpp.
  std::vector<std::vector<std::uint8_t>> gather_bytes(const std::vector<std::uint8_t>& bytes,
                                                      const Call& call);
  // Every rank's `tensor` (same shape everywhere), indexed by rank, for a
  // collective begun as `call`; not counted or checked again.
  std::vector<at::Tensor> gather_tensor(const at::Tensor& tensor, const Call& call);

  // True when the shared-memory transport carries this collective on
  // `tensor` (see ShmTransport::supports); every rank decides alike, since
  // the desync check holds them to one device, dtype and shape.
  bool on_shm(const at::Tensor& tensor, bool reduces) const {
    return shm && detail::ShmTransport::supports(tensor, reduces);
  }

  // True when send/recv between this rank and `peer` on `tensor` go
  // through the shared-memory mailbox.
  bool p2p_on_shm(const at::Tensor& tensor, int peer) const {
    return mailbox && tensor.device().is_cpu() &&
           host_of_rank[static_cast<std::size_t>(peer)] ==
               host_of_rank[static_cast<std::size_t>(rank)];
  }

  // True when the hierarchical path carries this all-reduce, reduce-scatter
  // or all-gather on `tensor`; every rank decides alike, as for on_shm().
  bool on_hier(const at::Tensor& tensor, bool reduces) const {
    return hier && detail::ShmTransport::supports(tensor, reduces);
  }

  // "shm" when on_shm(), "shm+gloo" when on_hier(`hierarchical`), else
  // backend_name_for(tensor): the transport named in the collective's
  // description.
  std::string transport_name(const at::Tensor& tensor, bool reduces,
                             bool hierarchical = false) const {
    if (on_shm(tensor, reduces)) return "shm";
    if (hierarchical && on_hier(tensor, reduces)) return "shm+gloo";
    return backend_name_for(tensor);
  }

  // The Work of a collective queued on the shared-memory transport: its
  // errors and timeouts read as those of a Gloo collective do.
  Work shm_work(std::shared_future<void> done, const Call& call) const {
    return Work(std::move(done), call.what, options.timeout, timeout_explainer(call.sequence));
  }

 private:
  // All-reduce of a small CPU int64 tensor through shm or Gloo, bypassing
  // numbering and checks. Collective; `what` names the outer call.
  void internal_all_reduce(at::Tensor& tensor, ReduceOp op, const Call& call);
  void check_desync(const detail::Fingerprint& mine, const Call& call);
};

namespace detail {

// Throws UsageError unless `tensor` is defined, dense and contiguous; `op`
// and `name` say which call and which argument.
void check_dense(const at::Tensor& tensor, const char* op, const char* name);

// "Float[7, 3]": a tensor's dtype and shape, for messages.
std::string tensor_text(const at::Tensor& tensor);

// Gloo has no bfloat16 type. Collectives that only move bytes send a bf16
// tensor as fp16 with the same bits (same element size).
inline at::Tensor as_gloo_bytes(const at::Tensor& tensor, bool nccl) {
  return tensor.scalar_type() == at::kBFloat16 && !nccl ? tensor.view(at::kHalf) : tensor;
}

// ProcessGroups of more than one rank alive in this process (their store,
// Gloo and shared-memory threads run). spawn() refuses to fork while any is.
std::atomic<int>& live_process_groups();
// Whether libtandem turned c10d's Flight Recorder off when it loaded
// (LibTorch 2.11-2.12 only; src/comm/flight_recorder_guard.cpp).
bool flight_recorder_turned_off();
}  // namespace detail

}  // namespace tandem
