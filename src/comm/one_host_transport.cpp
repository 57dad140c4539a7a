// OneHostTransport: every collective of a one-host group that the shared
// segment can carry, the others handed to c10d.

#include "comm/one_host_transport.h"

namespace tandem::detail {
namespace {

// Rank r's root-bound (or root-sent) piece of `bytes` at offset r * bytes.
ShmTransport::ExchangePlan rooted_exchange_plan(int world, int rank, int root, std::int64_t bytes,
                                                bool to_root) {
  ShmTransport::ExchangePlan plan;
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

// Offsets in bytes of each split of `rows`, in order.
std::vector<std::int64_t> split_byte_offsets(const std::vector<std::int64_t>& rows,
                                             std::int64_t row_bytes) {
  std::vector<std::int64_t> offsets(rows.size(), 0);
  for (std::size_t r = 1; r < rows.size(); ++r) {
    offsets[r] = offsets[r - 1] + rows[r - 1] * row_bytes;
  }
  return offsets;
}

}  // namespace

std::string OneHostTransport::name(const at::Tensor& tensor, bool reduces) const {
  return ShmTransport::supports(tensor, reduces) ? "shm" : fallback_.name(tensor, reduces);
}

Work OneHostTransport::all_reduce(at::Tensor tensor, ReduceOp op, const Call& call) {
  if (!ShmTransport::supports(tensor, /*reduces=*/true)) {
    return fallback_.all_reduce(tensor, op, call);
  }
  return work(shm_.all_reduce(tensor, op, call.what), call);
}

void OneHostTransport::all_gather(at::Tensor output, const at::Tensor& input, const Call& call) {
  if (!ShmTransport::supports(input, /*reduces=*/false)) {
    return fallback_.all_gather(output, input, call);
  }
  work(shm_.all_gather(output, input, call.what), call).wait();
}

void OneHostTransport::reduce_scatter(at::Tensor output, const at::Tensor& input, ReduceOp op,
                                      const Call& call) {
  if (!ShmTransport::supports(input, /*reduces=*/true)) {
    return fallback_.reduce_scatter(output, input, op, call);
  }
  work(shm_.reduce_scatter(output.view({-1}), input, op, call.what), call).wait();
}

void OneHostTransport::gather(at::Tensor whole, const at::Tensor& part, int root,
                              const Call& call) {
  if (!ShmTransport::supports(part, /*reduces=*/false)) {
    return fallback_.gather(whole, part, root, call);
  }
  const auto bytes = static_cast<std::int64_t>(part.numel() * part.element_size());
  auto plan = rooted_exchange_plan(world_size_, rank_, root, bytes, /*to_root=*/true);
  work(shm_.exchange(whole, part, std::move(plan), call.what), call).wait();
}

void OneHostTransport::scatter(at::Tensor output, const std::vector<at::Tensor>& inputs, int root,
                               const Call& call) {
  if (!ShmTransport::supports(output, /*reduces=*/false)) {
    return fallback_.scatter(output, inputs, root, call);
  }
  // The exchange reads one buffer: the root stacks its inputs (one copy).
  at::Tensor whole = rank_ == root ? at::stack(inputs) : at::Tensor();
  const auto bytes = static_cast<std::int64_t>(output.numel() * output.element_size());
  auto plan = rooted_exchange_plan(world_size_, rank_, root, bytes, /*to_root=*/false);
  work(shm_.exchange(output, whole, std::move(plan), call.what), call).wait();
}

void OneHostTransport::all_to_all(at::Tensor output, const at::Tensor& input,
                                  const AllToAllPlan& plan, const Call& call) {
  if (!ShmTransport::supports(input, /*reduces=*/false)) {
    return fallback_.all_to_all(output, input, plan, call);
  }
  std::int64_t row_bytes = static_cast<std::int64_t>(input.element_size());
  for (std::int64_t d = 1; d < input.dim(); ++d) row_bytes *= input.size(d);
  ShmTransport::ExchangePlan exchange;
  for (std::int64_t rows : plan.sent) exchange.bytes.push_back(rows * row_bytes);
  exchange.send_offsets = split_byte_offsets(plan.input_splits, row_bytes);
  exchange.recv_offsets = split_byte_offsets(plan.output_splits, row_bytes);
  work(shm_.exchange(output, input, std::move(exchange), call.what), call).wait();
}

}  // namespace tandem::detail
