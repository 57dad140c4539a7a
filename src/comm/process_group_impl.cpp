// ProcessGroup::Impl: transport choice, collective numbering, the desync check
// and the timeout explainer shared by every collective.

#include "comm/process_group_impl.h"

#include <sstream>

#include "tandem/core/error.h"

namespace tandem {

std::string detail::tensor_text(const at::Tensor& tensor) {
  std::ostringstream shape;
  shape << tensor.sizes();
  return c10::toString(tensor.scalar_type()) + shape.str();
}

void ProcessGroup::Impl::require_member(const char* op) const {
  if (!outside.empty()) TANDEM_THROW(UsageError, "{}: {}", op, outside);
}

void ProcessGroup::Impl::choose_transports() {
  one_host.reset();
  hierarchical.reset();
  mailbox_transport.reset();
  routes = {};
  if (!c10d) return;
  const auto timeout = options.timeout;
  // shm and hier never coexist: one needs every rank on one host, the other
  // several hosts.
  detail::Transport* flat = c10d.get();
  if (shm) {
    one_host = std::make_unique<detail::OneHostTransport>(*shm, *c10d, rank, world_size, timeout);
    flat = one_host.get();
  }
  routes.reduce = flat;
  if (hier) {
    hierarchical = std::make_unique<detail::HierarchicalTransport>(*hier, *c10d, timeout);
    routes.reduce = hierarchical.get();
  }
  routes.exchange = flat;
  routes.broadcast = c10d.get();
  routes.point_to_point = c10d.get();
  if (mailbox) {
    mailbox_transport = std::make_unique<detail::MailboxTransport>(*mailbox, *c10d, host_ids,
                                                                   rank, timeout);
    routes.point_to_point = mailbox_transport.get();
  }
}

ProcessGroup::Impl::Call ProcessGroup::Impl::begin(detail::CollectiveOp op,
                                                   const at::Tensor* tensor,
                                                   const std::string& backend,
                                                   std::int64_t reduce_op, std::int64_t root,
                                                   bool rows_vary) {
  Call call;
  call.sequence = sequence++;
  call.explain = timeout_explainer(call.sequence);
  if (tensor != nullptr) {
    std::ostringstream shape;
    shape << tensor->sizes();
    call.what = fmt::format("{} #{} {}{} on {}{}", detail::to_string(op), call.sequence,
                            c10::toString(tensor->scalar_type()), shape.str(), backend,
                            group.suffix());
  } else {
    call.what = fmt::format("{} #{}{}", detail::to_string(op), call.sequence, group.suffix());
  }
  if (setting_up) return call;
  // The report adds what the description leaves out, so that a timeout past
  // the checked window can tell two ranks in different calls apart.
  std::string report = call.what;
  if (reduce_op >= 0 && reduce_op <= static_cast<std::int64_t>(ReduceOp::kMin)) {
    report += fmt::format(" ({})", to_string(static_cast<ReduceOp>(reduce_op)));
  }
  if (root >= 0) report += fmt::format(" (root {})", root);
  monitor->entered(call.sequence, report);
  if (options.debug_detail || call.sequence < options.desync_check_collectives) {
    if (rows_vary && tensor != nullptr && tensor->dim() > 0) {
      std::vector<std::int64_t> sizes = tensor->sizes().vec();
      sizes[0] = -1;
      check_desync(detail::Fingerprint::of(op, call.sequence, tensor->scalar_type(),
                                           tensor->device().type(), sizes, reduce_op, root),
                   call);
    } else {
      check_desync(detail::Fingerprint::of(op, call.sequence, tensor, reduce_op, root), call);
    }
  }
  return call;
}

std::function<std::string()> ProcessGroup::Impl::timeout_explainer(std::uint64_t seq) const {
  if (setting_up || !monitor) return nullptr;
  return [monitor = monitor, seq] { return monitor->explain_timeout(seq); };
}

void ProcessGroup::Impl::internal_all_reduce(at::Tensor& tensor, ReduceOp op, const Call& call) {
  routes.exchange->all_reduce(tensor, op, call).wait();
}

void ProcessGroup::Impl::check_desync(const detail::Fingerprint& mine, const Call& call) {
  // One fixed-size MAX all-reduce of (fields, ~fields) yields the maximum and
  // the minimum of every field: equal means every rank agrees. Only on a
  // mismatch, which every rank sees alike, gather the rows to name ranks.
  constexpr int kFields = detail::Fingerprint::kFields;
  at::Tensor bounds = at::empty({2 * kFields}, at::kLong);
  auto* b = bounds.data_ptr<std::int64_t>();
  for (int i = 0; i < kFields; ++i) {
    b[i] = mine.fields[i];
    b[kFields + i] = ~mine.fields[i];
  }
  internal_all_reduce(bounds, ReduceOp::kMax, call);
  bool agree = true;
  for (int i = 0; i < kFields; ++i) agree = agree && b[i] == ~b[kFields + i];
  if (agree) return;

  at::Tensor rows = at::zeros({world_size, kFields}, at::kLong);
  auto* row = rows.data_ptr<std::int64_t>();
  std::copy(mine.fields.begin(), mine.fields.end(), row + static_cast<std::ptrdiff_t>(rank) * kFields);
  internal_all_reduce(rows, ReduceOp::kSum, call);  // zeros elsewhere: a gather
  std::vector<detail::Fingerprint> by_rank(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    std::copy(row + static_cast<std::ptrdiff_t>(r) * kFields,
              row + static_cast<std::ptrdiff_t>(r + 1) * kFields, by_rank[r].fields.begin());
  }
  std::string message = detail::find_desync(by_rank, group);
  if (message.empty()) message = "collective desync at " + call.what + " (the ranks disagreed)";
  TANDEM_THROW(UsageError, "{}", message);
}

}  // namespace tandem
