#pragma once
// Private state of tandem::ProcessGroup.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/c10d_transport.h"
#include "comm/collective_fingerprint.h"
#include "comm/group_ranks.h"
#include "comm/hierarchical.h"
#include "comm/hierarchical_transport.h"
#include "comm/mailbox_transport.h"
#include "comm/one_host_transport.h"
#include "comm/progress_monitor.h"
#include "comm/shm_mailbox.h"
#include "comm/shm_transport.h"
#include "comm/transport.h"
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
  // Gloo and NCCL; null on a group of one rank (is_local()).
  std::unique_ptr<detail::C10dTransport> c10d;
  std::unique_ptr<detail::ShmTransport> shm;  // all ranks on one host
  // Every rank's host_id(), by group rank, gathered when the group connected
  // (empty for a group of one).
  std::vector<std::string> host_ids;
  // send/recv between ranks of one host; null when no other rank shares
  // this rank's host or shared memory is off.
  std::unique_ptr<detail::ShmMailbox> mailbox;
  // Ranks on several hosts, some host holding more than one: the inner
  // groups and worker of the hierarchical collectives (hierarchical.h).
  std::unique_ptr<detail::Hierarchy> hier;
  // The transports over shm, hier and mailbox (null where those are), and
  // the one of each kind of traffic: set by choose_transports().
  std::unique_ptr<detail::OneHostTransport> one_host;
  std::unique_ptr<detail::HierarchicalTransport> hierarchical;
  std::unique_ptr<detail::MailboxTransport> mailbox_transport;
  detail::TransportRoutes routes;
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

  using Call = detail::Call;

  bool is_local() const { return !c10d; }

  // Throws the UsageError of `outside` on a rank outside the group; `op`
  // names the call.
  void require_member(const char* op) const;

  // Chooses the transport of each kind of traffic from the mechanisms
  // connected so far (c10d, shm, hier, mailbox); connect() calls it after
  // each step that adds one, so the group's own setup calls already use them.
  // Every rank chooses alike: the mechanisms rest on gathered data.
  void choose_transports();

  // Starts collective number `sequence` (and advances it): records it with
  // the progress monitor and, for the first options.desync_check_collectives
  // collectives or in debug mode, compares its fingerprint across ranks
  // (throws UsageError on a mismatch). Returns its description, used in
  // every error message: "all_reduce #12 Float[4, 8] on gloo", with " in
  // group [1, 3]" on a subgroup. With `rows_vary` (uneven all_to_all) the
  // fingerprint leaves dim 0 out, since it differs between ranks by design.
  Call begin(detail::CollectiveOp op, const at::Tensor* tensor, const std::string& backend,
             std::int64_t reduce_op = -1, std::int64_t root = -1, bool rows_vary = false);

  // What to say about the other ranks when collective `sequence` times out;
  // null while setting up.
  std::function<std::string()> timeout_explainer(std::uint64_t sequence) const;

  // Every rank's bytes, indexed by rank: the inner gathers of a collective
  // already begun as `call` (all_gather_bytes, new_group, the split sizes of
  // an uneven all_to_all). Not counted or checked again. collectives.cpp.
  std::vector<std::vector<std::uint8_t>> gather_bytes(const std::vector<std::uint8_t>& bytes,
                                                      const Call& call);
  // Every rank's `tensor` (same shape everywhere), indexed by rank, for a
  // collective begun as `call`; not counted or checked again.
  std::vector<at::Tensor> gather_tensor(const at::Tensor& tensor, const Call& call);

 private:
  // All-reduce of a small CPU int64 tensor on the exchange route (shm or
  // Gloo), bypassing numbering and checks. Collective; `call` is the outer
  // call's.
  void internal_all_reduce(at::Tensor& tensor, ReduceOp op, const Call& call);
  void check_desync(const detail::Fingerprint& mine, const Call& call);
};

namespace detail {

// Throws UsageError unless `tensor` is defined, dense and contiguous; `op`
// and `name` say which call and which argument.
void check_dense(const at::Tensor& tensor, const char* op, const char* name);

// "Float[7, 3]": a tensor's dtype and shape, for messages.
std::string tensor_text(const at::Tensor& tensor);

// ProcessGroups of more than one rank alive in this process (their store,
// Gloo and shared-memory threads run). spawn() refuses to fork while any is.
std::atomic<int>& live_process_groups();
// Whether libtandem turned c10d's Flight Recorder off when it loaded
// (LibTorch 2.11-2.12 only; src/comm/flight_recorder_guard.cpp).
bool flight_recorder_turned_off();
}  // namespace detail

}  // namespace tandem
