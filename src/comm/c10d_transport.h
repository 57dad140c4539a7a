#pragma once
// C10dTransport: collectives and point-to-point messages over c10d's Gloo,
// and NCCL for CUDA tensors when LibTorch has it and the group's
// cuda_backend allows (created on the first CUDA call). Every group of more
// than one rank has one; the shared-memory transports hand it what they
// cannot carry.
//
// Gloo has no bfloat16: collectives that only move bytes send bf16 as fp16
// with the same bits, and all-reduce reduces an fp32 copy. Gloo has no AVG
// either: SUM, then divide on completion. Gloo's reduce-scatter is an
// all-to-all followed by a local reduction.
//
// Point to point (c10d_point_to_point.cpp): each message is a header on tag
// 2 * tag and the data on tag 2 * tag + 1, for the reasons written there.
//
// Thread-safety: as Transport's. The NCCL group is created lazily on the
// caller's thread; every rank reaches its first CUDA call at the same point,
// so the creation is itself collective.

#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <utility>

#include "comm/transport.h"
#include "core/torch_compat.h"

namespace tandem::detail {

class C10dTransport final : public Transport {
 public:
  // `gloo`: the group's joined Gloo backend (shared, kept alive by this);
  // `store`, `rank`, `world_size`: where NCCL meets; `timeout`: every
  // collective's; `cuda_backend`: whether CUDA tensors go through NCCL.
  C10dTransport(c10::intrusive_ptr<compat::BackendBase> gloo, compat::StorePtr store, int rank,
                int world_size, std::chrono::milliseconds timeout, CudaBackend cuda_backend);

  std::string name(const at::Tensor& tensor, bool reduces) const override;

  Work all_reduce(at::Tensor tensor, ReduceOp op, const Call& call) override;
  void all_gather(at::Tensor output, const at::Tensor& input, const Call& call) override;
  void reduce_scatter(at::Tensor output, const at::Tensor& input, ReduceOp op,
                      const Call& call) override;
  void broadcast(at::Tensor tensor, int root, const Call& call) override;
  void gather(at::Tensor whole, const at::Tensor& part, int root, const Call& call) override;
  void scatter(at::Tensor output, const std::vector<at::Tensor>& inputs, int root,
               const Call& call) override;
  void all_to_all(at::Tensor output, const at::Tensor& input, const AllToAllPlan& plan,
                  const Call& call) override;
  // Always over Gloo, whatever device the group's tensors live on.
  void barrier(const Call& call) override;

  Work send(at::Tensor tensor, int dst, int tag, const PeerCall& call) override;
  // Not `blocking`: the header is awaited on a thread of its own, so that
  // receives from different ranks or tags never wait for one another.
  Work recv(at::Tensor tensor, int src, int tag, const PeerCall& call, bool blocking) override;

  // Rethrows the exception in flight as UsageError "<what> was rejected:
  // <first line>" (tandem::Errors pass unchanged): c10d's synchronous
  // refusals (a bad argument) at the call site.
  [[noreturn]] static void rethrow_usage(const std::string& what);

 private:
  bool uses_nccl(const at::Tensor& tensor) const;
  // The backend of `tensor`'s device; creates the NCCL group on first use.
  compat::BackendBase& backend_for(const at::Tensor& tensor);
  // The timeout c10d is given: tandem's, and a minute more for NCCL, whose
  // watchdog must not end the process before tandem's own deadline reports
  // the collective (work.cpp).
  std::chrono::milliseconds backend_timeout(const at::Tensor& tensor) const;
  // Wraps a c10d call that returns Work, translating synchronous errors.
  template <typename Fn>
  Work launch(const Call& call, Fn&& fn, std::function<void()> on_complete = nullptr);

  c10::intrusive_ptr<compat::BackendBase> gloo_;
  c10::intrusive_ptr<compat::BackendBase> nccl_;  // created on the first CUDA call
  compat::StorePtr store_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  CudaBackend cuda_backend_;
  // Point to point: for each (source rank, tag), when the last recv issued
  // has posted its data receive. Data receives of one (source, tag) are
  // posted in the order the recvs were issued (c10d_point_to_point.cpp).
  std::mutex recv_order_mutex_;
  std::map<std::pair<int, int>, std::shared_future<void>> recv_posted_;
};

// Gloo has no bfloat16 type. Collectives that only move bytes send a bf16
// tensor as fp16 with the same bits (same element size).
inline at::Tensor as_gloo_bytes(const at::Tensor& tensor, bool nccl) {
  return tensor.scalar_type() == at::kBFloat16 && !nccl ? tensor.view(at::kHalf) : tensor;
}

}  // namespace tandem::detail
