#pragma once
// OneHostTransport: the collectives of a group whose ranks all run on one
// host, through the group's shared segment (ShmTransport, shm_transport.h):
// all-reduce, all-gather and reduce-scatter, and gather, scatter and
// all_to_all as exchanges. Tensors the segment cannot carry (CUDA, or a
// dtype the reducing kernels lack) go to the C10dTransport it was given.
// Thread-safety: as Transport's.

#include <chrono>

#include "comm/c10d_transport.h"
#include "comm/shm_transport.h"
#include "comm/transport.h"

namespace tandem::detail {

class OneHostTransport final : public Transport {
 public:
  // `shm` and `fallback` must outlive this; `rank` and `world_size` are the
  // group's, `timeout` every collective's.
  OneHostTransport(ShmTransport& shm, C10dTransport& fallback, int rank, int world_size,
                   std::chrono::milliseconds timeout)
      : shm_(shm), fallback_(fallback), rank_(rank), world_size_(world_size), timeout_(timeout) {}

  std::string name(const at::Tensor& tensor, bool reduces) const override;
  Work all_reduce(at::Tensor tensor, ReduceOp op, const Call& call) override;
  void all_gather(at::Tensor output, const at::Tensor& input, const Call& call) override;
  void reduce_scatter(at::Tensor output, const at::Tensor& input, ReduceOp op,
                      const Call& call) override;
  void gather(at::Tensor whole, const at::Tensor& part, int root, const Call& call) override;
  void scatter(at::Tensor output, const std::vector<at::Tensor>& inputs, int root,
               const Call& call) override;
  void all_to_all(at::Tensor output, const at::Tensor& input, const AllToAllPlan& plan,
                  const Call& call) override;

 private:
  // The Work of a collective queued on the segment: its errors and
  // timeouts read as those of a Gloo collective do.
  Work work(std::shared_future<void> done, const Call& call) const {
    return Work(std::move(done), call.what, timeout_, call.explain);
  }

  ShmTransport& shm_;
  C10dTransport& fallback_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tandem::detail
