#pragma once
// MailboxTransport: send and recv between ranks of one host through shared
// memory (ShmMailbox, shm_mailbox.h); messages to ranks on other hosts, and
// CUDA tensors, go to the C10dTransport it was given. Chosen for a group's
// point-to-point traffic when another of its ranks shares this rank's host.
// Thread-safety: as Transport's.

#include <chrono>
#include <string>
#include <vector>

#include "comm/c10d_transport.h"
#include "comm/shm_mailbox.h"
#include "comm/transport.h"

namespace tandem::detail {

class MailboxTransport final : public Transport {
 public:
  // `mailbox` and `fallback` must outlive this; `host_of_rank`: every group
  // rank's host id; `timeout`: every message's.
  MailboxTransport(ShmMailbox& mailbox, C10dTransport& fallback,
                   std::vector<std::string> host_of_rank, int rank,
                   std::chrono::milliseconds timeout)
      : mailbox_(mailbox),
        fallback_(fallback),
        host_of_rank_(std::move(host_of_rank)),
        rank_(rank),
        timeout_(timeout) {}

  std::string name(const at::Tensor& tensor, bool reduces) const override {
    return fallback_.name(tensor, reduces);
  }
  // "shm" for a CPU message to a rank of this host.
  std::string peer_name(const at::Tensor& tensor, int peer) const override;
  Work send(at::Tensor tensor, int dst, int tag, const PeerCall& call) override;
  // The mailbox's receives are always asynchronous; `blocking` only
  // matters to c10d.
  Work recv(at::Tensor tensor, int src, int tag, const PeerCall& call, bool blocking) override;

 private:
  // True when messages with `peer` on `tensor` go through the mailbox.
  bool on_host(const at::Tensor& tensor, int peer) const {
    return tensor.device().is_cpu() &&
           host_of_rank_[static_cast<std::size_t>(peer)] ==
               host_of_rank_[static_cast<std::size_t>(rank_)];
  }

  ShmMailbox& mailbox_;
  C10dTransport& fallback_;
  std::vector<std::string> host_of_rank_;
  int rank_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tandem::detail
