#pragma once
// HierarchicalTransport: all-reduce, reduce-scatter and all-gather of a group
// whose ranks span several hosts, some holding more than one rank: shared
// memory inside each host, Gloo across (Hierarchy, hierarchical.h). Tensors
// the shared-memory steps cannot carry go to the C10dTransport it was given,
// flat. The group's other collectives are routed to c10d directly
// (TransportRoutes). Thread-safety: as Transport's.

#include <chrono>

#include "comm/c10d_transport.h"
#include "comm/hierarchical.h"
#include "comm/transport.h"

namespace tandem::detail {

class HierarchicalTransport final : public Transport {
 public:
  // `hierarchy` and `fallback` must outlive this; `timeout` is every
  // collective's.
  HierarchicalTransport(Hierarchy& hierarchy, C10dTransport& fallback,
                        std::chrono::milliseconds timeout)
      : hierarchy_(hierarchy), fallback_(fallback), timeout_(timeout) {}

  // "shm+gloo" for what it carries itself.
  std::string name(const at::Tensor& tensor, bool reduces) const override;
  Work all_reduce(at::Tensor tensor, ReduceOp op, const Call& call) override;
  void all_gather(at::Tensor output, const at::Tensor& input, const Call& call) override;
  void reduce_scatter(at::Tensor output, const at::Tensor& input, ReduceOp op,
                      const Call& call) override;

 private:
  Work work(std::shared_future<void> done, const Call& call) const {
    return Work(std::move(done), call.what, timeout_, call.explain);
  }

  Hierarchy& hierarchy_;
  C10dTransport& fallback_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tandem::detail
