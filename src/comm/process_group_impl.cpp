// ProcessGroup::Impl: backend choice, collective numbering, the desync check
// and the timeout explainer shared by every collective.

#include "comm/process_group_impl.h"

#include <sstream>

#include "tandem/core/error.h"

namespace tandem {

void ProcessGroup::Impl::rethrow_usage(const std::string& what) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason.resize(std::min(reason.find('\n'), reason.size()));
    TANDEM_THROW(UsageError, "{} was rejected: {}", what, reason);
  }
}

std::string detail::tensor_text(const at::Tensor& tensor) {
  std::ostringstream shape;
  shape << tensor.sizes();
  return c10::toString(tensor.scalar_type()) + shape.str();
}

void ProcessGroup::Impl::require_member(const char* op) const {
  if (!outside.empty()) TANDEM_THROW(UsageError, "{}: {}", op, outside);
}

bool ProcessGroup::Impl::uses_nccl(const at::Tensor& tensor) const {
#if defined(TANDEM_WITH_NCCL)
  return tensor.is_cuda() && options.cuda_backend != CudaBackend::kGloo;
#else
  (void)tensor;
  return false;
#endif
}

std::string ProcessGroup::Impl::backend_name_for(const at::Tensor& tensor) const {
  return uses_nccl(tensor) ? "nccl" : "gloo";
}

compat::BackendBase& ProcessGroup::Impl::backend_for(const at::Tensor& tensor) {
#if defined(TANDEM_WITH_NCCL)
  if (uses_nccl(tensor)) {
    if (!nccl) {
      // Every rank reaches its first CUDA collective at the same point, so
      // the lazy creation is itself collective.
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nccl", store);
      // NCCL's watchdog gets a minute more than tandem's own deadline, so a
      // stuck collective fails with tandem's TimeoutError naming it
      // (work.cpp, wait_for_nccl) before the watchdog takes the process down.
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = backend_timeout(tensor);
      nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, world_size,
                                                         nccl_options);
    }
    return *nccl;
  }
#else
  (void)tensor;
#endif
  return *gloo;
}

ProcessGroup::Impl::Call ProcessGroup::Impl::begin(detail::CollectiveOp op,
                                                   const at::Tensor* tensor,
                                                   const std::string& backend,
                                                   std::int64_t reduce_op, std::int64_t root,
                                                   bool rows_vary) {
  Call call;
  call.sequence = sequence++;
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
  monitor->entered(call.sequence, call.what);
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
  if (shm) {
    shm_work(shm->all_reduce(tensor, op, call.what), call).wait();
    return;
  }
  c10d::AllreduceOptions opts;
  opts.reduceOp = op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  opts.timeout = options.timeout;
  std::vector<at::Tensor> tensors{tensor};
  launch(call, [&] { return gloo->allreduce(tensors, opts); }).wait();
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
