// Transport's defaults: a method a transport is not routed throws, since
// reaching one means TransportRoutes sent a call where it cannot go.

#include "comm/transport.h"

#include <typeinfo>

#include "tandem/core/error.h"

namespace tandem::detail {

void Transport::not_routed(const char* method) const {
  TANDEM_THROW(Error, "internal error: {} was routed to a transport that has none ({}); please "
               "report this as a tandem bug",
               method, typeid(*this).name());
}

Work Transport::all_reduce(at::Tensor, ReduceOp, const Call&) { not_routed("all_reduce"); }
void Transport::all_gather(at::Tensor, const at::Tensor&, const Call&) {
  not_routed("all_gather");
}
void Transport::reduce_scatter(at::Tensor, const at::Tensor&, ReduceOp, const Call&) {
  not_routed("reduce_scatter");
}
void Transport::broadcast(at::Tensor, int, const Call&) { not_routed("broadcast"); }
void Transport::gather(at::Tensor, const at::Tensor&, int, const Call&) { not_routed("gather"); }
void Transport::scatter(at::Tensor, const std::vector<at::Tensor>&, int, const Call&) {
  not_routed("scatter");
}
void Transport::all_to_all(at::Tensor, const at::Tensor&, const AllToAllPlan&, const Call&) {
  not_routed("all_to_all");
}
void Transport::barrier(const Call&) { not_routed("barrier"); }
Work Transport::send(at::Tensor, int, int, const PeerCall&) { not_routed("send"); }
Work Transport::recv(at::Tensor, int, int, const PeerCall&, bool) { not_routed("recv"); }

}  // namespace tandem::detail
