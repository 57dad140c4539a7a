// HierarchicalTransport: the hierarchical steps for the tensors the
// shared-memory kernels carry, c10d for the others. The per-tensor test is
// ShmTransport::supports, as on one host: the steps inside a host run there.

#include "comm/hierarchical_transport.h"

#include "comm/shm_transport.h"

namespace tandem::detail {

std::string HierarchicalTransport::name(const at::Tensor& tensor, bool reduces) const {
  return ShmTransport::supports(tensor, reduces) ? "shm+gloo" : fallback_.name(tensor, reduces);
}

Work HierarchicalTransport::all_reduce(at::Tensor tensor, ReduceOp op, const Call& call) {
  if (!ShmTransport::supports(tensor, /*reduces=*/true)) {
    return fallback_.all_reduce(tensor, op, call);
  }
  if (tensor.numel() == 0) return Work();  // Hierarchy takes at least one element
  return work(hierarchy_.all_reduce(tensor, op), call);
}

void HierarchicalTransport::all_gather(at::Tensor output, const at::Tensor& input,
                                       const Call& call) {
  if (!ShmTransport::supports(input, /*reduces=*/false)) {
    return fallback_.all_gather(output, input, call);
  }
  work(hierarchy_.all_gather(output, input), call).wait();
}

void HierarchicalTransport::reduce_scatter(at::Tensor output, const at::Tensor& input,
                                           ReduceOp op, const Call& call) {
  if (!ShmTransport::supports(input, /*reduces=*/true)) {
    return fallback_.reduce_scatter(output, input, op, call);
  }
  work(hierarchy_.reduce_scatter(output.view({-1}), input, op), call).wait();
}

}  // namespace tandem::detail
