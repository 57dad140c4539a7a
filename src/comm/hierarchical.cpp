#include "comm/hierarchical.h"

#include <algorithm>
#include <map>
#include <optional>

#include <ATen/ATen.h>

#include "comm/shm_transport.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace hierarchical_detail {

// Sum, max and min reduce alike at every level; an average sums and divides
// once at the end by the whole group's size.
ReduceOp inner_op(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

// The flat paths reduce bfloat16 and half as an fp32 copy and round once:
// the hierarchical one does the same, so all round alike.
at::Tensor reduction_wire(const at::Tensor& tensor) {
  const bool half_type = tensor.scalar_type() == at::kBFloat16 || tensor.scalar_type() == at::kHalf;
  return half_type ? tensor.to(at::kFloat) : tensor;
}

}  // namespace hierarchical_detail

using hierarchical_detail::inner_op;
using hierarchical_detail::reduction_wire;

// ---- layout -----------------------------------------------------------------

HostLayout HostLayout::from_host_ids(const std::vector<std::string>& ids, int rank) {
  HostLayout layout;
  std::map<std::string, std::size_t> index;
  for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
    auto [it, fresh] = index.emplace(ids[static_cast<std::size_t>(r)], layout.hosts.size());
    if (fresh) layout.hosts.emplace_back();
    layout.hosts[it->second].push_back(r);
    if (r == rank) {
      layout.host = static_cast<int>(it->second);
      layout.local_rank = static_cast<int>(layout.hosts[it->second].size()) - 1;
    }
  }
  return layout;
}

bool HostLayout::hierarchical_helps() const {
  return hosts.size() > 1 && std::any_of(hosts.begin(), hosts.end(),
                                         [](const std::vector<int>& h) { return h.size() > 1; });
}

bool HostLayout::equal_hosts() const {
  return std::all_of(hosts.begin(), hosts.end(),
                     [&](const std::vector<int>& h) { return h.size() == hosts[0].size(); });
}

std::vector<int> HostLayout::counterparts(std::size_t j) const {
  std::vector<int> ranks;
  for (const auto& h : hosts) {
    if (h.size() > j) ranks.push_back(h[j]);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

int HostLayout::world() const {
  int n = 0;
  for (const auto& h : hosts) n += static_cast<int>(h.size());
  return n;
}

// ---- the worker -------------------------------------------------------------

Hierarchy::Hierarchy(HostLayout layout, HierarchicalForm form, std::shared_ptr<ProcessGroup> local,
                     ShmTransport* local_shm, std::shared_ptr<ProcessGroup> across)
    : layout_(std::move(layout)),
      form_(form),
      world_(layout_.world()),
      local_(std::move(local)),
      local_shm_(local_shm),
      across_(std::move(across)) {}

std::shared_future<void> Hierarchy::all_reduce(at::Tensor tensor, ReduceOp op) {
  return worker_.submit([this, tensor, op]() mutable { run_all_reduce(tensor, op); });
}

std::shared_future<void> Hierarchy::reduce_scatter(at::Tensor output, at::Tensor input,
                                                   ReduceOp op) {
  return worker_.submit(
      [this, output, input, op]() mutable { run_reduce_scatter(output, input, op); });
}

std::shared_future<void> Hierarchy::all_gather(at::Tensor output, at::Tensor input) {
  return worker_.submit([this, output, input]() mutable { run_all_gather(output, input); });
}

// ---- within the host --------------------------------------------------------

void Hierarchy::local_broadcast(at::Tensor& tensor) {
  const auto local = static_cast<int>(layout_.mine().size());
  if (local == 1) return;
  const auto bytes = static_cast<std::int64_t>(tensor.numel() * tensor.element_size());
  ShmTransport::ExchangePlan plan;
  plan.bytes.assign(static_cast<std::size_t>(local * local), 0);
  for (int j = 1; j < local; ++j) plan.bytes[static_cast<std::size_t>(j)] = bytes;
  plan.send_offsets.assign(static_cast<std::size_t>(local), 0);
  plan.recv_offsets.assign(static_cast<std::size_t>(local), 0);
  const bool leader = layout_.local_rank == 0;
  local_shm_
      ->exchange(leader ? at::Tensor() : tensor, leader ? tensor : at::Tensor(), std::move(plan),
                 fmt::format("hierarchical broadcast from rank {} within its host",
                             local_->global_ranks()[0]))
      .get();
}

void Hierarchy::local_scatter(at::Tensor& part, const at::Tensor& whole) {
  const auto& mine = layout_.mine();
  const auto local = static_cast<int>(mine.size());
  const std::int64_t n = part.numel();
  if (layout_.local_rank == 0) part.copy_(whole.narrow(0, mine[0] * n, n));
  if (local == 1) return;
  const auto bytes = static_cast<std::int64_t>(n * part.element_size());
  ShmTransport::ExchangePlan plan;
  plan.bytes.assign(static_cast<std::size_t>(local * local), 0);
  plan.send_offsets.assign(static_cast<std::size_t>(local), 0);
  plan.recv_offsets.assign(static_cast<std::size_t>(local), 0);
  for (int j = 1; j < local; ++j) {
    plan.bytes[static_cast<std::size_t>(j)] = bytes;
    plan.send_offsets[static_cast<std::size_t>(j)] = mine[static_cast<std::size_t>(j)] * bytes;
  }
  const bool leader = layout_.local_rank == 0;
  local_shm_
      ->exchange(leader ? at::Tensor() : part, leader ? whole : at::Tensor(), std::move(plan),
                 fmt::format("hierarchical scatter from rank {} within its host",
                             local_->global_ranks()[0]))
      .get();
}

// ---- the collectives --------------------------------------------------------

void Hierarchy::run_all_reduce(at::Tensor& tensor, ReduceOp op) {
  at::Tensor wire = reduction_wire(tensor);
  at::Tensor flat = wire.view({-1});
  const ReduceOp inner = inner_op(op);
  if (form_ == HierarchicalForm::kSplit) {
    split_all_reduce(flat, inner);
  } else {
    local_->all_reduce(flat, inner);
    if (layout_.local_rank == 0) across_->all_reduce(flat, inner);
    local_broadcast(flat);
  }
  if (op == ReduceOp::kAvg) wire.div_(world_);
  if (!wire.is_same(tensor)) tensor.copy_(wire);
}

void Hierarchy::split_all_reduce(at::Tensor& flat, ReduceOp inner) {
  // One piece in flight between hosts: its reduced shard, held until the
  // Gloo all-reduce is done and gathered back inside the host.
  struct Piece {
    at::Tensor whole;   // this piece of `flat`
    at::Tensor padded;  // `whole`, or a padded copy when L does not divide it
    at::Tensor mine;    // this rank's shard of `padded`
    Work across;
  };
  const auto finish = [this](Piece& piece) {
    piece.across.wait();
    local_->all_gather_into(piece.padded, piece.mine);  // shared memory: may alias
    if (!piece.padded.is_same(piece.whole)) {
      piece.whole.copy_(piece.padded.narrow(0, 0, piece.whole.numel()));
    }
  };
  const std::int64_t n = flat.numel();
  const auto local = static_cast<std::int64_t>(layout_.mine().size());
  const std::int64_t bytes = n * static_cast<std::int64_t>(flat.element_size());
  const std::int64_t pieces = std::clamp<std::int64_t>(
      (bytes + kPipelinePieceBytes - 1) / kPipelinePieceBytes, 1, kMaxPipelinePieces);
  const std::int64_t length = (n + pieces - 1) / pieces;
  std::optional<Piece> in_flight;
  for (std::int64_t start = 0; start < n; start += length) {
    // Local rank j owns shard j of the piece; the last shards are padded
    // when the elements do not divide (the padding is never read back).
    Piece piece;
    piece.whole = flat.narrow(0, start, std::min(length, n - start));
    const std::int64_t m = piece.whole.numel();
    const std::int64_t shard = (m + local - 1) / local;
    piece.padded = shard * local == m
                       ? piece.whole
                       : at::cat({piece.whole, at::zeros({shard * local - m}, flat.options())});
    piece.mine = piece.padded.narrow(0, layout_.local_rank * shard, shard);
    local_->reduce_scatter(piece.mine, piece.padded, inner);  // may alias its own chunk
    piece.across = across_->all_reduce_async(piece.mine, inner);
    if (in_flight) finish(*in_flight);
    in_flight = std::move(piece);
  }
  if (in_flight) finish(*in_flight);
}

void Hierarchy::run_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const std::int64_t n = output.numel();
  const ReduceOp inner = inner_op(op);
  at::Tensor out = reduction_wire(output).view({-1});
  if (form_ == HierarchicalForm::kSplit) {
    // Local rank j reduces, within the host, the chunks of counterpart group
    // j (in that group's rank order), then reduce-scatters them across hosts:
    // its own chunk comes back.
    const auto local = layout_.mine().size();
    std::vector<std::int64_t> order;
    for (std::size_t j = 0; j < local; ++j) {
      for (int r : layout_.counterparts(j)) order.push_back(r);
    }
    at::Tensor staged = reduction_wire(input.view({world_, n}).index_select(
        0, at::tensor(order, at::TensorOptions().dtype(at::kLong))));
    const auto hosts = static_cast<std::int64_t>(layout_.hosts.size());
    at::Tensor block = at::empty({hosts * n}, staged.options());
    local_->reduce_scatter(block, staged.view({-1}), inner);
    across_->reduce_scatter(out, block, inner);
  } else {
    at::Tensor whole = reduction_wire(input).reshape({-1}).clone();
    local_->all_reduce(whole, inner);
    if (layout_.local_rank == 0) across_->all_reduce(whole, inner);
    local_scatter(out, whole);
  }
  if (op == ReduceOp::kAvg) out.div_(world_);
  if (out.data_ptr() != output.data_ptr()) output.view({-1}).copy_(out);
}

void Hierarchy::run_all_gather(at::Tensor& output, const at::Tensor& input) {
  const std::int64_t n = input.numel();
  at::Tensor in = input.reshape({-1});
  at::Tensor rows = output.view({world_, n});
  const auto hosts = static_cast<std::int64_t>(layout_.hosts.size());
  if (form_ == HierarchicalForm::kSplit) {
    // Across hosts first (each rank's input crosses the network once), then
    // the host's L blocks over shared memory; then into group-rank order.
    const auto local = static_cast<std::int64_t>(layout_.mine().size());
    at::Tensor across = at::empty({hosts * n}, in.options());
    across_->all_gather_into(across, in);
    at::Tensor host = at::empty({local * hosts * n}, in.options());
    local_->all_gather_into(host, across);
    std::vector<std::int64_t> order;
    for (std::size_t j = 0; j < static_cast<std::size_t>(local); ++j) {
      for (int r : layout_.counterparts(j)) order.push_back(r);
    }
    rows.index_copy_(0, at::tensor(order, at::TensorOptions().dtype(at::kLong)),
                     host.view({local * hosts, n}));
    return;
  }
  const auto& mine = layout_.mine();
  std::size_t largest = 0;
  for (const auto& h : layout_.hosts) largest = std::max(largest, h.size());
  const auto widest = static_cast<std::int64_t>(largest);
  at::Tensor host = at::zeros({widest * n}, in.options());
  at::Tensor filled = host.narrow(0, 0, static_cast<std::int64_t>(mine.size()) * n);
  local_->all_gather_into(filled, in);
  if (layout_.local_rank == 0) {
    // Leaders are the hosts' lowest ranks, so leader group rank h is host h.
    at::Tensor all = at::empty({hosts * widest * n}, in.options());
    across_->all_gather_into(all, host);
    at::Tensor blocks = all.view({hosts, widest, n});
    for (std::size_t h = 0; h < layout_.hosts.size(); ++h) {
      const auto& ranks = layout_.hosts[h];
      for (std::size_t j = 0; j < ranks.size(); ++j) {
        rows[ranks[j]].copy_(blocks[static_cast<std::int64_t>(h)][static_cast<std::int64_t>(j)]);
      }
    }
  }
  at::Tensor flat = output.view({-1});
  local_broadcast(flat);
}

}  // namespace tandem::detail
