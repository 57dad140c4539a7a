// ProcessGroup::gather and scatter: every rank's tensor to a root, and a
// root's tensors to every rank. Shared memory carries them when the group's
// ranks share a host (an exchange in which only the root receives, or only
// the root sends), Gloo otherwise (NCCL for CUDA tensors).

#include <ATen/record_function.h>

#include "comm/process_group_impl.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

void check_rooted_root(int root, int world, const char* op) {
  TANDEM_CHECK_ARG(root >= 0 && root < world,
                   "{}: root {} is not a rank of this group of {} ranks (0..{})", op, root, world,
                   world - 1);
}

// Rank r's root-bound (or root-sent) piece of `bytes` at offset r * bytes.
detail::ShmTransport::ExchangePlan rooted_plan(int world, int rank, int root, std::int64_t bytes,
                                               bool to_root) {
  detail::ShmTransport::ExchangePlan plan;
  const auto w = static_cast<std::size_t>(world);
  plan.bytes.assign(w * w, 0);
  plan.send_offsets.assign(w, 0);
  plan.recv_offsets.assign(w, 0);
  for (int r = 0; r < world; ++r) {
    const auto src = static_cast<std::size_t>(to_root ? r : root);
    const auto dst = static_cast<std::size_t>(to_root ? root : r);
    plan.bytes[src * w + dst] = bytes;
    if (to_root && rank == root) plan.recv_offsets[static_cast<std::size_t>(r)] = r * bytes;
    if (!to_root && rank == root) plan.send_offsets[static_cast<std::size_t>(r)] = r * bytes;
  }
  return plan;
}

std::vector<std::int64_t> rooted_stacked_shape(int world, const at::Tensor& part) {
  std::vector<std::int64_t> shape{world};
  shape.insert(shape.end(), part.sizes().begin(), part.sizes().end());
  return shape;
}

}  // namespace

std::vector<at::Tensor> ProcessGroup::gather(const at::Tensor& tensor, int root) {
  RECORD_USER_SCOPE("tandem::gather");
  impl_->require_member("gather");
  detail::check_dense(tensor, "gather", "the tensor");
  const int world = impl_->world_size;
  check_rooted_root(root, world, "gather");
  if (impl_->is_local()) return {tensor.clone()};
  auto call = impl_->begin(detail::CollectiveOp::kGather, &tensor,
                           impl_->transport_name(tensor, /*reduces=*/false), -1, root);
  const bool is_root = impl_->rank == root;
  at::Tensor whole = is_root ? at::empty(rooted_stacked_shape(world, tensor), tensor.options())
                             : at::Tensor();
  auto result = [&] { return is_root ? whole.unbind(0) : std::vector<at::Tensor>{}; };
  if (tensor.numel() == 0) return result();
  if (impl_->on_shm(tensor, /*reduces=*/false)) {
    const auto bytes = static_cast<std::int64_t>(tensor.numel() * tensor.element_size());
    auto plan = rooted_plan(world, impl_->rank, root, bytes, /*to_root=*/true);
    impl_->shm_work(impl_->shm->exchange(whole, tensor, std::move(plan), call.what), call).wait();
    return result();
  }
  auto& backend = impl_->backend_for(tensor);
  const bool nccl = impl_->uses_nccl(tensor);
  std::vector<std::vector<at::Tensor>> outputs;
  if (is_root) {
    outputs.emplace_back();
    for (int r = 0; r < world; ++r) outputs[0].push_back(detail::as_gloo_bytes(whole[r], nccl));
  }
  c10d::GatherOptions opts;
  opts.rootRank = root;
  opts.timeout = impl_->backend_timeout(tensor);
  impl_->launch(call, [&] {
          std::vector<at::Tensor> inputs{detail::as_gloo_bytes(tensor, nccl)};
          return backend.gather(outputs, inputs, opts);
        }).wait();
  return result();
}

void ProcessGroup::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int root) {
  RECORD_USER_SCOPE("tandem::scatter");
  impl_->require_member("scatter");
  detail::check_dense(output, "scatter", "the output");
  const int world = impl_->world_size;
  check_rooted_root(root, world, "scatter");
  const bool is_root = impl_->rank == root;
  if (is_root) {
    TANDEM_CHECK_ARG(static_cast<int>(inputs.size()) == world,
                     "scatter: the root passed {} input tensor(s); it needs one per rank ({})",
                     inputs.size(), world);
    for (std::size_t r = 0; r < inputs.size(); ++r) {
      const auto& in = inputs[r];
      TANDEM_CHECK_ARG(in.defined() && in.sizes() == output.sizes() &&
                           in.scalar_type() == output.scalar_type() &&
                           in.device() == output.device(),
                       "scatter: inputs[{}] must match the output ({} on {}), got {}", r,
                       detail::tensor_text(output), output.device().str(),
                       in.defined() ? detail::tensor_text(in) + " on " + in.device().str()
                                    : std::string("an undefined tensor"));
    }
  }
  if (impl_->is_local()) {
    output.copy_(inputs[0]);
    return;
  }
  auto call = impl_->begin(detail::CollectiveOp::kScatter, &output,
                           impl_->transport_name(output, /*reduces=*/false), -1, root);
  if (output.numel() == 0) return;
  if (impl_->on_shm(output, /*reduces=*/false)) {
    // The exchange reads one buffer: the root stacks its inputs (one copy).
    at::Tensor whole = is_root ? at::stack(inputs) : at::Tensor();
    const auto bytes = static_cast<std::int64_t>(output.numel() * output.element_size());
    auto plan = rooted_plan(world, impl_->rank, root, bytes, /*to_root=*/false);
    impl_->shm_work(impl_->shm->exchange(output, whole, std::move(plan), call.what), call).wait();
    return;
  }
  auto& backend = impl_->backend_for(output);
  const bool nccl = impl_->uses_nccl(output);
  std::vector<std::vector<at::Tensor>> sources;
  if (is_root) {
    sources.emplace_back();
    for (const auto& in : inputs) sources[0].push_back(detail::as_gloo_bytes(in.contiguous(), nccl));
  }
  c10d::ScatterOptions opts;
  opts.rootRank = root;
  opts.timeout = impl_->backend_timeout(output);
  impl_->launch(call, [&] {
          std::vector<at::Tensor> outputs{detail::as_gloo_bytes(output, nccl)};
          return backend.scatter(outputs, sources, opts);
        }).wait();
}

}  // namespace tandem
