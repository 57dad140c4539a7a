// MailboxTransport: CPU messages between ranks of one host through the
// mailbox, whose lanes bound their own waits by the timeout; the rest
// through c10d.

#include "comm/mailbox_transport.h"

namespace tandem::detail {

std::string MailboxTransport::peer_name(const at::Tensor& tensor, int peer) const {
  return on_host(tensor, peer) ? "shm" : fallback_.peer_name(tensor, peer);
}

Work MailboxTransport::send(at::Tensor tensor, int dst, int tag, const PeerCall& call) {
  if (!on_host(tensor, dst)) return fallback_.send(tensor, dst, tag, call);
  auto done = mailbox_.send(tensor, dst, tag, {call.what, call.peer, call.explain});
  return Work(std::move(done), call.what, timeout_);
}

Work MailboxTransport::recv(at::Tensor tensor, int src, int tag, const PeerCall& call,
                            bool blocking) {
  if (!on_host(tensor, src)) return fallback_.recv(tensor, src, tag, call, blocking);
  auto done = mailbox_.recv(tensor, src, tag, {call.what, call.peer, call.explain});
  return Work(std::move(done), call.what, timeout_);
}

}  // namespace tandem::detail
