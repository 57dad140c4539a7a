// ProcessGroup::send and recv: checked and described here, then carried by
// the group's point-to-point transport (transport.h): the shared-memory
// mailbox between ranks of one host (mailbox_transport.h), c10d otherwise
// (c10d_point_to_point.cpp, which says how a message travels over Gloo).

#include <ATen/record_function.h>

#include "comm/p2p_message.h"
#include "comm/process_group_impl.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

constexpr int kMaxP2pTag = 1 << 30;

// Checks a send's or recv's arguments, records it with the progress monitor
// and returns how messages describe it ("recv from rank 2, tag 5, Float[7]
// on gloo"), name the peer, and explain a timeout.
detail::PeerCall begin_point_to_point(const ProcessGroup::Impl& impl, const at::Tensor& tensor,
                                      int peer, int tag, const char* op) {
  impl.require_member(op);
  const bool sending = std::string(op) == "send";
  detail::check_dense(tensor, op, "the tensor");
  TANDEM_CHECK_ARG(peer >= 0 && peer < impl.world_size,
                   "{}: {} {} is not a rank of this group of {} ranks (0..{})", op,
                   sending ? "destination" : "source", peer, impl.world_size, impl.world_size - 1);
  TANDEM_CHECK_ARG(peer != impl.rank,
                   "{}: rank {} cannot {} itself; copy the tensor instead", op, impl.rank,
                   sending ? "send to" : "receive from");
  TANDEM_CHECK_ARG(tag >= 0 && tag < kMaxP2pTag, "{}: tag {} is out of range [0, 2^30)", op, tag);
  detail::PeerCall call;
  call.what = fmt::format("{} {} {}, tag {}, {} on {}", op, sending ? "to" : "from",
                          impl.group.name(peer), tag, detail::tensor_text(tensor),
                          impl.routes.point_to_point->peer_name(tensor, peer));
  call.peer = impl.group.name(peer);
  call.explain = [monitor = impl.monitor, peer] { return monitor->explain_peer(peer); };
  impl.monitor->entered_point_to_point(impl.sequence, call.what);
  return call;
}

}  // namespace

Work ProcessGroup::send_async(at::Tensor tensor, int dst, int tag) {
  const auto call = begin_point_to_point(*impl_, tensor, dst, tag, "send");
  return impl_->routes.point_to_point->send(tensor, dst, tag, call);
}

void ProcessGroup::send(const at::Tensor& tensor, int dst, int tag) {
  RECORD_USER_SCOPE("tandem::send");
  send_async(tensor, dst, tag).wait();
}

void ProcessGroup::recv(at::Tensor& tensor, int src, int tag) {
  RECORD_USER_SCOPE("tandem::recv");
  const auto call = begin_point_to_point(*impl_, tensor, src, tag, "recv");
  impl_->routes.point_to_point->recv(tensor, src, tag, call, /*blocking=*/true).wait();
}

Work ProcessGroup::recv_async(at::Tensor tensor, int src, int tag) {
  const auto call = begin_point_to_point(*impl_, tensor, src, tag, "recv");
  return impl_->routes.point_to_point->recv(tensor, src, tag, call, /*blocking=*/false);
}

}  // namespace tandem

namespace tandem::detail {

void throw_foreign_p2p(const std::string& what, const std::string& peer) {
  TANDEM_THROW(CommError,
               "{}: the message from {} is not a tandem send (a different tandem build, or a "
               "tag shared with another library)",
               what, peer);
}

void throw_p2p_mismatch(const std::string& what, const std::string& peer, const P2pHeader& header,
                        const at::Tensor& tensor) {
  TANDEM_THROW(UsageError,
               "{}: {} sent {} element(s) of {} but this rank receives {} element(s) of {}. A send "
               "and its recv must agree on dtype and element count (the shape may differ); check "
               "that both sides compute the size alike and use the same tag for the same message",
               what, peer, header.numel, c10::toString(header.scalar_type()), tensor.numel(),
               c10::toString(tensor.scalar_type()));
}

}  // namespace tandem::detail
