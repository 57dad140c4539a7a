// C10dTransport::send and recv over Gloo (NCCL for CUDA data).
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
// (source, tag) has posted its own (recv_posted_). Since that header came
// first, the wait is short.
//
// An asynchronous recv waits for the header on a thread of its own, so that
// receives from different ranks or tags never wait for one another (one of
// them may depend on a message this rank sends later). The thread holds the
// backends and the tensor, never the group, and its waits are bounded by the
// timeout.

#include <future>
#include <thread>

#include "comm/c10d_transport.h"
#include "comm/comm_error.h"
#include "comm/p2p_message.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

at::Tensor p2p_header(const at::Tensor& tensor) {
  at::Tensor header = at::empty({3}, at::kLong);
  *reinterpret_cast<P2pHeader*>(header.data_ptr<std::int64_t>()) = P2pHeader::of(tensor);
  return header;
}

// A receive in progress; everything its thread needs, nothing of the group.
struct PendingRecv {
  c10::intrusive_ptr<compat::BackendBase> gloo;  // carries the header
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
    rethrow_as_comm_error(recv.what, recv.timeout, recv.explain);
  }
}

// Posts the data receive into `into` after the previous recv of this (src,
// tag) posted its own, then tells the next one.
compat::WorkPtr post_recv_data(PendingRecv& recv, const at::Tensor& into) {
  if (recv.previous_posted.valid()) recv.previous_posted.wait();
  compat::WorkPtr work;
  try {
    std::vector<at::Tensor> tensors{as_gloo_bytes(into, recv.nccl)};
    work = recv.data_backend->recv(tensors, recv.src, 2 * recv.tag + 1);
  } catch (...) {
    recv.posted->set_value();
    rethrow_as_comm_error(recv.what, recv.timeout, recv.explain);
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
  const auto h = *reinterpret_cast<const P2pHeader*>(recv.header.data_ptr<std::int64_t>());
  if (h.magic != kP2pMagic) {
    recv.posted->set_value();
    throw_foreign_p2p(recv.what, recv.peer);
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
  throw_p2p_mismatch(recv.what, recv.peer, h, recv.tensor);
}

}  // namespace

Work C10dTransport::send(at::Tensor tensor, int dst, int tag, const PeerCall& call) {
  std::vector<compat::WorkPtr> works;
  try {
    std::vector<at::Tensor> header{p2p_header(tensor)};
    works.push_back(gloo_->send(header, dst, 2 * tag));
    if (tensor.numel() > 0) {
      std::vector<at::Tensor> data{as_gloo_bytes(tensor, uses_nccl(tensor))};
      works.push_back(backend_for(tensor).send(data, dst, 2 * tag + 1));
    }
  } catch (...) {
    rethrow_usage(call.what);
  }
  return Work(std::move(works), timeout_, call.what, call.explain);
}

Work C10dTransport::recv(at::Tensor tensor, int src, int tag, const PeerCall& call,
                         bool blocking) {
  // Post the header receive and take this recv's place in the order of its
  // (src, tag).
  auto recv = std::make_shared<PendingRecv>();
  recv->what = call.what;
  recv->gloo = gloo_;
  recv->nccl = uses_nccl(tensor);
  recv->data_backend = c10::intrusive_ptr<compat::BackendBase>::reclaim_copy(&backend_for(tensor));
  recv->tensor = tensor;
  recv->header = at::empty({3}, at::kLong);
  recv->src = src;
  recv->tag = tag;
  recv->peer = call.peer;
  recv->timeout = timeout_;
  recv->explain = call.explain;
  recv->posted = std::make_shared<std::promise<void>>();
  try {
    std::vector<at::Tensor> header{recv->header};
    recv->header_work = recv->gloo->recv(header, src, 2 * tag);
  } catch (...) {
    rethrow_usage(recv->what);
  }
  {
    std::lock_guard<std::mutex> lock(recv_order_mutex_);
    auto& last = recv_posted_[{src, tag}];
    recv->previous_posted = last;
    last = recv->posted->get_future().share();
  }
  if (blocking) {
    finish_recv(*recv);
    return Work();
  }
  auto done = std::make_shared<std::promise<void>>();
  std::shared_future<void> future = done->get_future().share();
  std::thread([recv, done, label = thread_rank_label()] {
    if (label.first >= 0) set_thread_rank_label(label.first, label.second);
    try {
      finish_recv(*recv);
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  // finish_recv already explained any timeout.
  return Work(std::move(future), recv->what, timeout_);
}

}  // namespace tandem::detail
