// ProcessGroup::send and recv: between ranks of one host through the
// shared-memory mailbox (shm_mailbox.h), otherwise over Gloo (NCCL for CUDA
// data), as below.
//
// Each message is two: a header (magic, dtype, element count) on Gloo tag
// 2 * tag, then the data on tag 2 * tag + 1. The receiver posts the data
// receive only once the header says it fits: Gloo, given a message longer
// than the posted buffer, fails an assertion on its network thread (the
// process dies), and given a shorter one completes with part of the buffer
// stale. A mismatched message is drained into a scratch buffer, so the
// channel stays in step, and the recv throws UsageError naming both sides.
//
// Ordering. Gloo matches messages of one (peer, tag) in order, separately per
// tag, so the headers of successive recvs from one rank arrive in the order
// the recvs were issued. The data receives must be posted in that order too:
// each recv waits, after its header, until the previous recv of the same
// (source, tag) has posted its own (Impl::recv_posted). Since that header came
// first, the wait is short.
//
// recv_async waits for the header on a thread of its own, so that receives
// from different ranks or tags never wait for one another (one of them may
// depend on a message this rank sends later). The thread holds the backends
// and the tensor, never the group, and its waits are bounded by the timeout.

#include <future>
#include <thread>

#include <ATen/record_function.h>

#include "comm/comm_error.h"
#include "comm/p2p_message.h"
#include "comm/process_group_impl.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

constexpr int kMaxP2pTag = 1 << 30;

at::Tensor p2p_header(const at::Tensor& tensor) {
  at::Tensor header = at::empty({3}, at::kLong);
  *reinterpret_cast<detail::P2pHeader*>(header.data_ptr<std::int64_t>()) =
      detail::P2pHeader::of(tensor);
  return header;
}

// A receive in progress; everything its thread needs, nothing of the group.
struct PendingRecv {
  c10::intrusive_ptr<compat::BackendBase> gloo;
  c10::intrusive_ptr<compat::BackendBase> data_backend;
  bool nccl = false;
  at::Tensor tensor;
  at::Tensor header;
  compat::WorkPtr header_work;
  int src = 0;
  int tag = 0;
  std::string what;
  std::string peer;  // how messages name the sender
  std::chrono::milliseconds timeout{0};
  std::function<std::string()> explain;
  std::shared_future<void> previous_posted;  // invalid when it is the first
  std::shared_ptr<std::promise<void>> posted;
};

// Waits for `work` within the timeout, translating its errors.
void wait_p2p(const compat::WorkPtr& work, const PendingRecv& recv) {
  try {
    work->wait(recv.timeout);
  } catch (...) {
    detail::rethrow_as_comm_error(recv.what, recv.timeout, recv.explain);
  }
}

// Posts the data receive into `into` after the previous recv of this (src,
// tag) posted its own, then tells the next one.
compat::WorkPtr post_recv_data(PendingRecv& recv, const at::Tensor& into) {
  if (recv.previous_posted.valid()) recv.previous_posted.wait();
  compat::WorkPtr work;
  try {
    std::vector<at::Tensor> tensors{detail::as_gloo_bytes(into, recv.nccl)};
    work = recv.data_backend->recv(tensors, recv.src, 2 * recv.tag + 1);
  } catch (...) {
    recv.posted->set_value();
    detail::rethrow_as_comm_error(recv.what, recv.timeout, recv.explain);
  }
  recv.posted->set_value();
  return work;
}

void finish_recv(PendingRecv& recv) {
  try {
    wait_p2p(recv.header_work, recv);
  } catch (...) {
    recv.posted->set_value();  // later recvs must not wait for this one
    throw;
  }
  const auto h = *reinterpret_cast<const detail::P2pHeader*>(recv.header.data_ptr<std::int64_t>());
  if (h.magic != detail::kP2pMagic) {
    recv.posted->set_value();
    detail::throw_foreign_p2p(recv.what, recv.peer);
  }
  if (h.fits(recv.tensor)) {
    if (h.numel == 0) {
      recv.posted->set_value();
      return;
    }
    wait_p2p(post_recv_data(recv, recv.tensor), recv);
    return;
  }
  // Drain the message, so that the next one on this tag is read in step.
  if (h.numel > 0) {
    at::Tensor scratch = at::empty({h.numel}, recv.tensor.options().dtype(h.scalar_type()));
    wait_p2p(post_recv_data(recv, scratch), recv);
  } else {
    recv.posted->set_value();
  }
  detail::throw_p2p_mismatch(recv.what, recv.peer, h, recv.tensor);
}

// Checks a send's or recv's arguments; returns how messages describe it:
// "recv from rank 2, tag 5, Float[7] on gloo".
std::string describe_point_to_point(const ProcessGroup::Impl& impl, const at::Tensor& tensor,
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
  return fmt::format("{} {} {}, tag {}, {} on {}", op, sending ? "to" : "from",
                     impl.group.name(peer), tag, detail::tensor_text(tensor),
                     impl.p2p_on_shm(tensor, peer) ? "shm" : impl.backend_name_for(tensor));
}

// Between ranks of one host, CPU messages go through the shared-memory
// mailbox; its lanes bound their own waits by the timeout.
Work shm_point_to_point(ProcessGroup::Impl& impl, const at::Tensor& tensor, int peer, int tag,
                        bool sending, const std::string& what) {
  detail::ShmMailbox::Message message{
      what, impl.group.name(peer),
      [monitor = impl.monitor, peer] { return monitor->explain_peer(peer); }};
  auto done = sending ? impl.mailbox->send(tensor, peer, tag, std::move(message))
                      : impl.mailbox->recv(tensor, peer, tag, std::move(message));
  return Work(std::move(done), what, impl.options.timeout);
}

}  // namespace

Work ProcessGroup::send_async(at::Tensor tensor, int dst, int tag) {
  const std::string what = describe_point_to_point(*impl_, tensor, dst, tag, "send");
  impl_->monitor->entered_point_to_point(impl_->sequence, what);
  if (impl_->p2p_on_shm(tensor, dst)) return shm_point_to_point(*impl_, tensor, dst, tag, true, what);
  std::vector<compat::WorkPtr> works;
  try {
    std::vector<at::Tensor> header{p2p_header(tensor)};
    works.push_back(impl_->gloo->send(header, dst, 2 * tag));
    if (tensor.numel() > 0) {
      std::vector<at::Tensor> data{detail::as_gloo_bytes(tensor, impl_->uses_nccl(tensor))};
      works.push_back(impl_->backend_for(tensor).send(data, dst, 2 * tag + 1));
    }
  } catch (...) {
    Impl::rethrow_usage(what);
  }
  return Work(std::move(works), impl_->options.timeout, what,
              [monitor = impl_->monitor, dst] { return monitor->explain_peer(dst); });
}

void ProcessGroup::send(const at::Tensor& tensor, int dst, int tag) {
  RECORD_USER_SCOPE("tandem::send");
  send_async(tensor, dst, tag).wait();
}

namespace {

// Starts a recv: posts its header receive and takes its place in the order
// of its (src, tag).
std::shared_ptr<PendingRecv> start_recv(ProcessGroup::Impl& impl, const at::Tensor& tensor,
                                        int src, int tag) {
  auto recv = std::make_shared<PendingRecv>();
  recv->what = describe_point_to_point(impl, tensor, src, tag, "recv");
  impl.monitor->entered_point_to_point(impl.sequence, recv->what);
  recv->gloo = impl.gloo;
  recv->nccl = impl.uses_nccl(tensor);
  recv->data_backend = c10::intrusive_ptr<compat::BackendBase>::reclaim_copy(&impl.backend_for(tensor));
  recv->tensor = tensor;
  recv->header = at::empty({3}, at::kLong);
  recv->src = src;
  recv->tag = tag;
  recv->peer = impl.group.name(src);
  recv->timeout = impl.options.timeout;
  recv->explain = [monitor = impl.monitor, src] { return monitor->explain_peer(src); };
  recv->posted = std::make_shared<std::promise<void>>();
  try {
    std::vector<at::Tensor> header{recv->header};
    recv->header_work = impl.gloo->recv(header, src, 2 * tag);
  } catch (...) {
    ProcessGroup::Impl::rethrow_usage(recv->what);
  }
  std::lock_guard<std::mutex> lock(impl.recv_order_mutex);
  auto& last = impl.recv_posted[{src, tag}];
  recv->previous_posted = last;
  last = recv->posted->get_future().share();
  return recv;
}

}  // namespace

void ProcessGroup::recv(at::Tensor& tensor, int src, int tag) {
  RECORD_USER_SCOPE("tandem::recv");
  if (impl_->mailbox) {
    recv_async(tensor, src, tag).wait();
    return;
  }
  auto pending = start_recv(*impl_, tensor, src, tag);
  finish_recv(*pending);
}

Work ProcessGroup::recv_async(at::Tensor tensor, int src, int tag) {
  if (impl_->mailbox) {
    const std::string what = describe_point_to_point(*impl_, tensor, src, tag, "recv");
    if (impl_->p2p_on_shm(tensor, src)) {
      impl_->monitor->entered_point_to_point(impl_->sequence, what);
      return shm_point_to_point(*impl_, tensor, src, tag, false, what);
    }
  }
  auto pending = start_recv(*impl_, tensor, src, tag);
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  std::thread([pending, done, label = thread_rank_label()] {
    if (label.first >= 0) set_thread_rank_label(label.first, label.second);
    try {
      finish_recv(*pending);
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  // finish_recv already explained any timeout.
  return Work(std::move(future), pending->what, impl_->options.timeout);
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
