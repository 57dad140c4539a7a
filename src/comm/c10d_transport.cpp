// C10dTransport's collectives: Gloo, or NCCL for CUDA tensors.

#include "comm/c10d_transport.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

c10d::ReduceOp c10d_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: SUM, then divide on completion.
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<compat::BackendBase> gloo, compat::StorePtr store,
                             int rank, int world_size, std::chrono::milliseconds timeout,
                             CudaBackend cuda_backend)
    : gloo_(std::move(gloo)),
      store_(std::move(store)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      cuda_backend_(cuda_backend) {}

void C10dTransport::rethrow_usage(const std::string& what) {
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

bool C10dTransport::uses_nccl(const at::Tensor& tensor) const {
#if defined(TANDEM_WITH_NCCL)
  return tensor.is_cuda() && cuda_backend_ != CudaBackend::kGloo;
#else
  (void)tensor;
  return false;
#endif
}

std::string C10dTransport::name(const at::Tensor& tensor, bool /*reduces*/) const {
  return uses_nccl(tensor) ? "nccl" : "gloo";
}

std::chrono::milliseconds C10dTransport::backend_timeout(const at::Tensor& tensor) const {
  return uses_nccl(tensor) ? timeout_ + std::chrono::minutes(1) : timeout_;
}

compat::BackendBase& C10dTransport::backend_for(const at::Tensor& tensor) {
#if defined(TANDEM_WITH_NCCL)
  if (uses_nccl(tensor)) {
    if (!nccl_) {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nccl", store_);
      // NCCL's watchdog gets a minute more than tandem's own deadline, so a
      // stuck collective fails with tandem's TimeoutError naming it
      // (work.cpp, wait_for_nccl) before the watchdog takes the process down.
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = backend_timeout(tensor);
      nccl_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank_, world_size_,
                                                          nccl_options);
    }
    return *nccl_;
  }
#else
  (void)tensor;
#endif
  return *gloo_;
}

template <typename Fn>
Work C10dTransport::launch(const Call& call, Fn&& fn, std::function<void()> on_complete) {
  compat::WorkPtr work;
  try {
    work = fn();
  } catch (...) {
    rethrow_usage(call.what);
  }
  return Work(std::move(work), timeout_, call.what, std::move(on_complete), call.explain);
}

Work C10dTransport::all_reduce(at::Tensor tensor, ReduceOp op, const Call& call) {
  auto& backend = backend_for(tensor);
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d_reduce_op(op);
  opts.timeout = backend_timeout(tensor);
  // Gloo cannot reduce bfloat16, and sums half in half: reduce an fp32 copy
  // and round once at the end, as the shared-memory kernels do.
  const bool upcast =
      (tensor.scalar_type() == at::kBFloat16 || tensor.scalar_type() == at::kHalf) &&
      !uses_nccl(tensor);
  at::Tensor wire = upcast ? tensor.to(at::kFloat) : tensor;
  std::function<void()> finish = [tensor, wire, upcast, op, world = world_size_]() mutable {
    if (op == ReduceOp::kAvg) wire.div_(world);
    if (upcast) tensor.copy_(wire);
  };
  return launch(
      call,
      [&] {
        std::vector<at::Tensor> tensors{wire};
        return backend.allreduce(tensors, opts);
      },
      std::move(finish));
}

void C10dTransport::broadcast(at::Tensor tensor, int root, const Call& call) {
  auto& backend = backend_for(tensor);
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = backend_timeout(tensor);
  launch(call, [&] {
    std::vector<at::Tensor> tensors{as_gloo_bytes(tensor, uses_nccl(tensor))};
    return backend.broadcast(tensors, opts);
  }).wait();
}

void C10dTransport::all_gather(at::Tensor output, const at::Tensor& input, const Call& call) {
  auto& backend = backend_for(input);
  const bool nccl = uses_nccl(input);
  const std::int64_t n = input.numel();
  auto flat_out = output.view({-1});
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < world_size_; ++r) {
    outputs[0].push_back(as_gloo_bytes(flat_out.narrow(0, r * n, n), nccl));
  }
  c10d::AllgatherOptions opts;
  opts.timeout = backend_timeout(input);
  launch(call, [&] {
    std::vector<at::Tensor> inputs{as_gloo_bytes(input.reshape({-1}), nccl)};
    return backend.allgather(outputs, inputs, opts);
  }).wait();
}

void C10dTransport::reduce_scatter(at::Tensor output, const at::Tensor& input, ReduceOp op,
                                   const Call& call) {
  const int world = world_size_;
  const std::int64_t n = output.numel();
  auto flat_out = output.view({-1});
  auto& backend = backend_for(input);
  auto flat_in = input.view({-1});
  if (uses_nccl(input)) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d_reduce_op(op);
    opts.timeout = backend_timeout(input);
    std::vector<std::vector<at::Tensor>> inputs(1);
    for (int r = 0; r < world; ++r) inputs[0].push_back(flat_in.narrow(0, r * n, n));
    launch(call, [&] {
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
  opts.timeout = timeout_;
  launch(call, [&] {
    std::vector<int64_t> even_split;
    at::Tensor into = as_gloo_bytes(received, false);
    at::Tensor from = as_gloo_bytes(flat_in, false);
    return backend.alltoall_base(into, from, even_split, even_split, opts);
  }).wait();
  auto chunks = received.view({world, n});
  const bool half_type =
      input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
  if (half_type && (op == ReduceOp::kSum || op == ReduceOp::kAvg)) {
    // In fp32, rounded once (an average of bfloat16 would round twice).
    at::Tensor total = chunks.sum(0, /*keepdim=*/false, at::kFloat);
    if (op == ReduceOp::kAvg) total.div_(world);
    flat_out.copy_(total);
    return;
  }
  switch (op) {
    case ReduceOp::kSum: at::sum_out(flat_out, chunks, {0}); break;
    case ReduceOp::kAvg: at::sum_out(flat_out, chunks, {0}); flat_out.div_(world); break;
    case ReduceOp::kMax: at::amax_out(flat_out, chunks, {0}); break;
    case ReduceOp::kMin: at::amin_out(flat_out, chunks, {0}); break;
  }
}

void C10dTransport::gather(at::Tensor whole, const at::Tensor& part, int root, const Call& call) {
  auto& backend = backend_for(part);
  const bool nccl = uses_nccl(part);
  std::vector<std::vector<at::Tensor>> outputs;
  if (rank_ == root) {
    outputs.emplace_back();
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(as_gloo_bytes(whole[r], nccl));
  }
  c10d::GatherOptions opts;
  opts.rootRank = root;
  opts.timeout = backend_timeout(part);
  launch(call, [&] {
    std::vector<at::Tensor> inputs{as_gloo_bytes(part, nccl)};
    return backend.gather(outputs, inputs, opts);
  }).wait();
}

void C10dTransport::scatter(at::Tensor output, const std::vector<at::Tensor>& inputs, int root,
                            const Call& call) {
  auto& backend = backend_for(output);
  const bool nccl = uses_nccl(output);
  std::vector<std::vector<at::Tensor>> sources;
  if (rank_ == root) {
    sources.emplace_back();
    for (const auto& in : inputs) sources[0].push_back(as_gloo_bytes(in.contiguous(), nccl));
  }
  c10d::ScatterOptions opts;
  opts.rootRank = root;
  opts.timeout = backend_timeout(output);
  launch(call, [&] {
    std::vector<at::Tensor> outputs{as_gloo_bytes(output, nccl)};
    return backend.scatter(outputs, sources, opts);
  }).wait();
}

void C10dTransport::all_to_all(at::Tensor output, const at::Tensor& input,
                               const AllToAllPlan& plan, const Call& call) {
  auto& backend = backend_for(input);
  const bool nccl = uses_nccl(input);
  c10d::AllToAllOptions opts;
  opts.timeout = backend_timeout(input);
  launch(call, [&] {
    std::vector<std::int64_t> out_splits = plan.even ? std::vector<std::int64_t>{}
                                                     : plan.output_splits;
    std::vector<std::int64_t> in_splits = plan.even ? std::vector<std::int64_t>{}
                                                    : plan.input_splits;
    at::Tensor into = as_gloo_bytes(output, nccl);
    at::Tensor from = as_gloo_bytes(input, nccl);
    return backend.alltoall_base(into, from, out_splits, in_splits, opts);
  }).wait();
}

void C10dTransport::barrier(const Call& call) {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  launch(call, [&] { return gloo_->barrier(opts); }).wait();
}

}  // namespace tandem::detail
