// Stages 2 and 3: pack a complete group's gradients, free them, and
// reduce-scatter the pack on the communication thread into this rank's
// gradient shard while backward goes on.

#include "zero/sharded_reduce_scatter.h"

#include <chrono>

#include <ATen/ATen.h>

namespace tandem::detail {

ShardedReduceScatter::ShardedReduceScatter(const ZeroLayout& layout, UnitGatherer& gatherer,
                                           ProcessGroup& pg, ProcessGroup* replicate,
                                           CommQueue& queue, CommClock& clock,
                                           bool reduce_scatter)
    : layout_(layout),
      gatherer_(gatherer),
      pg_(pg),
      replicate_(replicate),
      queue_(queue),
      clock_(clock),
      reduce_scatter_(reduce_scatter),
      wire_(layout.groups().size()) {}

void ShardedReduceScatter::group_complete(std::size_t g) {
  const FlatGroup& group = layout_.groups()[g];
  torch::NoGradGuard no_grad;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(layout_.device());
  // A stage-3 unit's gathered fp32 parameters are freed here anyway: their
  // memory, the wire's exact size, takes the packed gradients instead of a
  // second buffer of the unit's size.
  at::Tensor& wire = wire_[g];
  wire = group.partitioned_params ? gatherer_.take_whole(g) : at::Tensor();
  if (!wire.defined()) wire = at::empty({group.padded}, fp32);
  int64_t packed_end = 0;  // zero what no gradient fills: unused members, padding
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    const at::Tensor& param = layout_.params()[group.members[k]];
    at::Tensor& grad = param.mutable_grad();
    const int64_t numel = param.numel();
    if (!grad.defined()) {  // unused this step: contributes zeros
      wire.narrow(0, group.offsets[k], numel).zero_();
    } else {
      wire.narrow(0, group.offsets[k], numel).copy_(grad.reshape({-1}));
      grad = at::Tensor();  // the full gradient lives no longer than its bucket
    }
    packed_end = group.offsets[k] + numel;
  }
  wire.narrow(0, packed_end, group.padded - packed_end).zero_();
  if (group.partitioned_params) gatherer_.release(g);
}

void ShardedReduceScatter::add_late_gradient(std::size_t index) {
  const std::size_t g = layout_.group_of()[index];
  const FlatGroup& group = layout_.groups()[g];
  at::Tensor& grad = layout_.params()[index].mutable_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    if (group.members[k] != index) continue;
    wire_[g].narrow(0, group.offsets[k], grad.numel()).add_(grad.reshape({-1}));
  }
  grad = at::Tensor();
}

void ShardedReduceScatter::launch(std::size_t index) {
  // The task holds what it uses, not the policy: the queue may still run it
  // while the engine is being destroyed (the layout outlives the queue).
  const FlatGroup* g = &layout_.groups()[index];
  at::Tensor wire = std::move(wire_[index]);
  wire_[index] = at::Tensor();
  queue_.submit([pg = &pg_, replicate = replicate_, clock = &clock_, layout = &layout_, g, wire,
                 reduce_scatter = reduce_scatter_]() mutable {
    torch::NoGradGuard no_grad;
    at::Tensor shard;
    auto start = std::chrono::steady_clock::now();
    if (reduce_scatter) {
      shard = at::empty({g->shard_numel}, wire.options());
      pg->reduce_scatter(shard, wire, ReduceOp::kAvg);
      clock->add_since(&ZeroOptimizer::CommStats::reduce_scatter_seconds, start);
      clock->add_bytes(&ZeroOptimizer::CommStats::reduce_scatter_bytes,
                       wire.numel() * static_cast<int64_t>(wire.element_size()));
    } else {
      // DeepSpeed's reduce_scatter: false: the whole pack is averaged on
      // every rank, which keeps its own slice.
      pg->all_reduce(wire, ReduceOp::kAvg);
      shard = wire.narrow(0, g->shard_begin, g->shard_numel);
      clock->count(&ZeroOptimizer::CommStats::gradient_all_reduces);
    }
    if (replicate != nullptr) {
      // HSDP: the counterparts in the other shard groups hold the same
      // slice, averaged over their group; averaging across them gives the
      // world's average. The only collective that crosses shard groups.
      start = std::chrono::steady_clock::now();
      replicate->all_reduce(shard, ReduceOp::kAvg);
      clock->add_since(&ZeroOptimizer::CommStats::replicate_all_reduce_seconds, start);
      clock->add_bytes(&ZeroOptimizer::CommStats::replicate_bytes,
                       shard.numel() * static_cast<int64_t>(shard.element_size()));
    }
    // Micro-steps accumulate into the shard until zero_grad().
    if (shard.device() == g->grad_shard.device()) {
      g->grad_shard.add_(shard);
    } else {
      // Offloaded: through a pinned buffer (the caching host allocator
      // reuses it), not a fresh pageable tensor each step, whose first touch
      // and staged copy cost more than the update itself.
      g->grad_shard.add_(layout->to_state_device(shard));
    }
  });
}

void ShardedReduceScatter::end_backward() { gatherer_.end_backward(); }

void ShardedReduceScatter::zero_grad() {
  torch::NoGradGuard no_grad;
  for (const auto& group : layout_.groups()) group.grad_shard.zero_();
  // Between steps no full gradient is kept: the packs carried them.
  for (const auto& p : layout_.params()) p.mutable_grad() = at::Tensor();
}

}  // namespace tandem::detail
