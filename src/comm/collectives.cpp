// ProcessGroup's collectives: each numbered, checked against the other
// ranks' (desync), bounded by the timeout, and carried by shared memory
// (ranks on one host), the hierarchical path (ranks on several hosts, some
// host holding several), NCCL (CUDA tensors) or Gloo.

#include "tandem/comm/process_group.h"

#include <ATen/record_function.h>

#include "comm/comm_error.h"
#include "comm/process_group_impl.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: SUM, then divide on completion.
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void check_avg(const at::Tensor& tensor, ReduceOp op, const char* name) {
  TANDEM_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                   "{}: ReduceOp::kAvg needs a floating-point tensor, got {}; use kSum and divide",
                   name, c10::toString(tensor.scalar_type()));
}

// The whole tensor of a gather or scatter (`name`) against this rank's part.
void check_whole(const at::Tensor& whole, const at::Tensor& part, int world, const char* op,
                 const char* name) {
  TANDEM_CHECK_ARG(whole.numel() == part.numel() * world &&
                       whole.scalar_type() == part.scalar_type() &&
                       whole.device() == part.device(),
                   "{}: {} must hold world_size ({}) x {} elements of {} on {}, got {} of {} on {}",
                   op, name, world, part.numel(), c10::toString(part.scalar_type()),
                   part.device().str(), whole.numel(), c10::toString(whole.scalar_type()),
                   whole.device().str());
}

}  // namespace

void detail::check_dense(const at::Tensor& tensor, const char* op, const char* name) {
  TANDEM_CHECK_ARG(tensor.defined(), "{}: {} is an undefined tensor", op, name);
  TANDEM_CHECK_ARG(tensor.is_contiguous() && !tensor.is_sparse(),
                   "{}: {} must be a dense contiguous tensor; call .contiguous() first", op, name);
}

// ---- collectives ------------------------------------------------------------

Work ProcessGroup::all_reduce_async(at::Tensor tensor, ReduceOp op) {
  RECORD_USER_SCOPE("tandem::all_reduce_async");
  impl_->require_member("all_reduce");
  detail::check_dense(tensor, "all_reduce", "the tensor");
  check_avg(tensor, op, "all_reduce");
  if (impl_->is_local()) return Work();
  const auto reduce = static_cast<std::int64_t>(op);
  if (impl_->on_shm(tensor, /*reduces=*/true)) {
    auto call = impl_->begin(detail::CollectiveOp::kAllReduce, &tensor, "shm", reduce);
    return impl_->shm_work(impl_->shm->all_reduce(tensor, op, call.what), call);
  }
  if (impl_->on_hier(tensor, /*reduces=*/true)) {
    auto call = impl_->begin(detail::CollectiveOp::kAllReduce, &tensor, "shm+gloo", reduce);
    if (tensor.numel() == 0) return Work();
    return impl_->shm_work(impl_->hier->all_reduce(tensor, op), call);
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllReduce, &tensor,
                           impl_->backend_name_for(tensor), reduce);
  auto& backend = impl_->backend_for(tensor);
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = impl_->backend_timeout(tensor);
  // Gloo cannot reduce bfloat16: reduce an fp32 copy and round once at the end.
  const bool upcast = tensor.scalar_type() == at::kBFloat16 && !impl_->uses_nccl(tensor);
  at::Tensor wire = upcast ? tensor.to(at::kFloat) : tensor;
  std::function<void()> finish = [tensor, wire, upcast, op, world = impl_->world_size]() mutable {
    if (op == ReduceOp::kAvg) wire.div_(world);
    if (upcast) tensor.copy_(wire);
  };
  return impl_->launch(
      call,
      [&] {
        std::vector<at::Tensor> tensors{wire};
        return backend.allreduce(tensors, opts);
      },
      std::move(finish));
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  RECORD_USER_SCOPE("tandem::all_reduce");
  all_reduce_async(tensor, op).wait();
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  RECORD_USER_SCOPE("tandem::broadcast");
  impl_->require_member("broadcast");
  detail::check_dense(tensor, "broadcast", "the tensor");
  TANDEM_CHECK_ARG(root >= 0 && root < impl_->world_size,
                   "broadcast: root {} is not a rank of this world of {}", root, impl_->world_size);
  if (impl_->is_local()) return;
  auto call = impl_->begin(detail::CollectiveOp::kBroadcast, &tensor,
                           impl_->backend_name_for(tensor), -1, root);
  auto& backend = impl_->backend_for(tensor);
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = impl_->backend_timeout(tensor);
  impl_->launch(call, [&] {
          std::vector<at::Tensor> tensors{detail::as_gloo_bytes(tensor, impl_->uses_nccl(tensor))};
          return backend.broadcast(tensors, opts);
        }).wait();
}

// The all-gather proper, for a collective already begun as `call` (also the
// inner gathers of all_gather_bytes, which are numbered and checked once).
std::vector<at::Tensor> ProcessGroup::Impl::gather_tensor(const at::Tensor& tensor,
                                                          const Call& call) {
  Impl& impl = *this;
  // Gloo divides by the element count: empty tensors must not reach it.
  if (tensor.numel() == 0) {
    return std::vector<at::Tensor>(static_cast<size_t>(impl.world_size), tensor.clone());
  }
  if (impl.on_shm(tensor, /*reduces=*/false)) {
    std::vector<int64_t> shape{impl.world_size};
    shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
    at::Tensor all = at::empty(shape, tensor.options());
    impl.shm_work(impl.shm->all_gather(all, tensor, call.what), call).wait();
    return all.unbind(0);
  }
  if (impl.on_hier(tensor, /*reduces=*/false)) {
    std::vector<int64_t> shape{impl.world_size};
    shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
    at::Tensor all = at::empty(shape, tensor.options());
    impl.shm_work(impl.hier->all_gather(all, tensor), call).wait();
    return all.unbind(0);
  }
  auto& backend = impl.backend_for(tensor);
  const bool nccl = impl.uses_nccl(tensor);
  std::vector<at::Tensor> results;
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < impl.world_size; ++r) {
    results.push_back(at::empty_like(tensor));
    outputs[0].push_back(detail::as_gloo_bytes(results.back(), nccl));
  }
  c10d::AllgatherOptions opts;
  opts.timeout = impl.backend_timeout(tensor);
  impl.launch(call, [&] {
        std::vector<at::Tensor> inputs{detail::as_gloo_bytes(tensor.contiguous(), nccl)};
        return backend.allgather(outputs, inputs, opts);
      }).wait();
  return results;
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  RECORD_USER_SCOPE("tandem::all_gather");
  impl_->require_member("all_gather");
  detail::check_dense(tensor, "all_gather", "the input");
  if (impl_->is_local()) {
    return std::vector<at::Tensor>(static_cast<size_t>(impl_->world_size), tensor.clone());
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllGather, &tensor,
                           impl_->transport_name(tensor, /*reduces=*/false, /*hierarchical=*/true));
  return impl_->gather_tensor(tensor, call);
}

void ProcessGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  RECORD_USER_SCOPE("tandem::all_gather_into");
  impl_->require_member("all_gather_into");
  detail::check_dense(input, "all_gather_into", "the input");
  detail::check_dense(output, "all_gather_into", "the output");
  const int64_t n = input.numel();
  check_whole(output, input, impl_->world_size, "all_gather_into", "output");
  auto flat_out = output.view({-1});
  if (impl_->is_local()) {
    flat_out.copy_(input.reshape({-1}));
    return;
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllGatherInto, &input,
                           impl_->transport_name(input, /*reduces=*/false, /*hierarchical=*/true));
  if (n == 0) return;
  if (impl_->on_shm(input, /*reduces=*/false)) {
    impl_->shm_work(impl_->shm->all_gather(flat_out, input, call.what), call).wait();
    return;
  }
  if (impl_->on_hier(input, /*reduces=*/false)) {
    impl_->shm_work(impl_->hier->all_gather(flat_out, input), call).wait();
    return;
  }
  // Gloo or NCCL: ranks on several hosts, or CUDA tensors.
  auto& backend = impl_->backend_for(input);
  std::vector<std::vector<at::Tensor>> outputs(1);
  const bool nccl = impl_->uses_nccl(input);
  for (int r = 0; r < impl_->world_size; ++r) {
    outputs[0].push_back(detail::as_gloo_bytes(flat_out.narrow(0, r * n, n), nccl));
  }
  c10d::AllgatherOptions opts;
  opts.timeout = impl_->backend_timeout(input);
  impl_->launch(call, [&] {
          std::vector<at::Tensor> inputs{detail::as_gloo_bytes(input.reshape({-1}), nccl)};
          return backend.allgather(outputs, inputs, opts);
        }).wait();
}

void ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  RECORD_USER_SCOPE("tandem::reduce_scatter");
  impl_->require_member("reduce_scatter");
  detail::check_dense(input, "reduce_scatter", "the input");
  detail::check_dense(output, "reduce_scatter", "the output");
  check_avg(input, op, "reduce_scatter");
  const int world = impl_->world_size;
  const int64_t n = output.numel();
  check_whole(input, output, world, "reduce_scatter", "input");
  auto flat_out = output.view({-1});
  if (impl_->is_local()) {
    flat_out.copy_(input.reshape({-1}));
    return;
  }
  auto call = impl_->begin(detail::CollectiveOp::kReduceScatter, &input,
                           impl_->transport_name(input, /*reduces=*/true, /*hierarchical=*/true),
                           static_cast<std::int64_t>(op));
  if (n == 0) return;
  if (impl_->on_shm(input, /*reduces=*/true)) {
    impl_->shm_work(impl_->shm->reduce_scatter(flat_out, input, op, call.what), call).wait();
    return;
  }
  if (impl_->on_hier(input, /*reduces=*/true)) {
    impl_->shm_work(impl_->hier->reduce_scatter(flat_out, input, op), call).wait();
    return;
  }
  auto& backend = impl_->backend_for(input);
  auto flat_in = input.view({-1});
  if (impl_->uses_nccl(input)) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = impl_->backend_timeout(input);
    std::vector<std::vector<at::Tensor>> inputs(1);
    for (int r = 0; r < world; ++r) inputs[0].push_back(flat_in.narrow(0, r * n, n));
    impl_->launch(call, [&] {
            std::vector<at::Tensor> outputs{flat_out};
            return backend.reduce_scatter(outputs, inputs, opts);
          }).wait();
    if (op == ReduceOp::kAvg) output.div_(world);
    return;
  }
  // Gloo (ranks on several hosts, or a dtype the shared-memory kernels do not
  // reduce): all-to-all moves chunk r of every rank to rank r; reduce locally.
  auto received = at::empty({world * n}, input.options());
  c10d::AllToAllOptions opts;
  opts.timeout = impl_->options.timeout;
  impl_->launch(call, [&] {
          std::vector<int64_t> even_split;
          at::Tensor into = detail::as_gloo_bytes(received, false);
          at::Tensor from = detail::as_gloo_bytes(flat_in, false);
          return backend.alltoall_base(into, from, even_split, even_split, opts);
        }).wait();
  auto chunks = received.view({world, n});
  switch (op) {
    case ReduceOp::kSum: at::sum_out(flat_out, chunks, {0}); break;
    case ReduceOp::kAvg: at::sum_out(flat_out, chunks, {0}); flat_out.div_(world); break;
    case ReduceOp::kMax: at::amax_out(flat_out, chunks, {0}); break;
    case ReduceOp::kMin: at::amin_out(flat_out, chunks, {0}); break;
  }
}

void ProcessGroup::barrier() {
  RECORD_USER_SCOPE("tandem::barrier");
  impl_->require_member("barrier");
  if (impl_->is_local()) return;
  c10d::BarrierOptions opts;
  opts.timeout = impl_->options.timeout;
  auto call = impl_->begin(detail::CollectiveOp::kBarrier, nullptr, "gloo");
  impl_->launch(call, [&] { return impl_->gloo->barrier(opts); }).wait();
}

std::vector<std::vector<std::uint8_t>> ProcessGroup::all_gather_bytes(
    const std::vector<std::uint8_t>& bytes) {
  RECORD_USER_SCOPE("tandem::all_gather_bytes");
  impl_->require_member("all_gather_bytes");
  if (impl_->is_local()) return {bytes};
  // Sizes differ between ranks by design: the fingerprint holds no shape.
  auto call = impl_->begin(detail::CollectiveOp::kAllGatherBytes, nullptr, "gloo");
  return impl_->gather_bytes(bytes, call);
}

std::vector<std::vector<std::uint8_t>> ProcessGroup::Impl::gather_bytes(
    const std::vector<std::uint8_t>& bytes, const Call& call) {
  if (is_local()) return {bytes};
  auto size = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  auto sizes = gather_tensor(size, call);
  int64_t longest = 1;
  for (const auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  auto padded = at::zeros({longest}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), padded.data_ptr<std::uint8_t>());
  auto gathered = gather_tensor(padded, call);
  std::vector<std::vector<std::uint8_t>> result;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const auto* data = gathered[r].data_ptr<std::uint8_t>();
    result.emplace_back(data, data + sizes[r].item<int64_t>());
  }
  return result;
}

std::vector<std::string> ProcessGroup::all_gather_strings(const std::string& text) {
  impl_->require_member("all_gather_strings");
  auto gathered = all_gather_bytes(std::vector<std::uint8_t>(text.begin(), text.end()));
  std::vector<std::string> result;
  for (const auto& bytes : gathered) result.emplace_back(bytes.begin(), bytes.end());
  return result;
}

}  // namespace tandem
