// Backward under ZeRO: hooks count each group's gradients in, complete groups
// are packed (or, in stage 1, are their flat buffer already) and launched on
// the communication thread strictly in group order, so every rank issues the
// same collectives in the same sequence.

#include "zero/gradient_reducer.h"

#include <chrono>

#include <ATen/ATen.h>

#include "parallel/backward_callbacks.h"
#include "parallel/flat_grad.h"
#include "tandem/core/error.h"

namespace tandem::detail {

GradientReducer::GradientReducer(const ZeroLayout& layout, UnitGatherer& gatherer,
                                 ProcessGroup& pg, ProcessGroup* replicate, CommQueue& queue,
                                 CommClock& clock, const ZeroOptions& options)
    : layout_(layout),
      gatherer_(gatherer),
      pg_(pg),
      replicate_(replicate),
      queue_(queue),
      clock_(clock),
      stage_(options.stage),
      reduce_scatter_(options.reduce_scatter),
      overlap_comm_(options.overlap_comm),
      wire_(layout.groups().size()) {
  readiness_.reset(layout_.group_of(), layout_.groups().size());
  for (std::size_t i = 0; i < layout_.params().size(); ++i) {
    grad_hooks_.push_back(
        internals::add_grad_ready_hook(layout_.params()[i], [this, i] { on_grad_ready(i); }));
  }
}

bool GradientReducer::in_backward() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return readiness_.in_backward();
}

void GradientReducer::set_gradient_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward(), "ZeroOptimizer::set_gradient_sync() called during backward");
  sync_enabled_ = enabled;
}

void GradientReducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.drain();
  torch::NoGradGuard no_grad;
  for (const auto& group : layout_.groups()) {
    if (group.grad_full.defined()) group.grad_full.zero_();
    if (!group.grad_shard_is_view) group.grad_shard.zero_();
  }
  if (stage_ != 1) {
    for (const auto& p : layout_.params()) p.mutable_grad() = at::Tensor();
  }
}

void GradientReducer::on_grad_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stage_ == 1 && !sync_enabled_) return;  // accumulate locally, as DDP's no_sync
  if (readiness_.start_if_idle()) {
    // Not Engine::queue_callback: inside a checkpointed block's nested
    // backward that would finalize when the block's backward ends, not the
    // model's.
    queue_end_of_backward([this] { finalize_backward(); });
  }
  if (!readiness_.mark_ready(index)) return;
  if (stage_ == 1) adopt_grad(index);
  if (readiness_.arrive(index)) {
    prepare(layout_.group_of()[index]);
    // Without overlap_comm the packs wait for the end of backward.
    if (overlap_comm_) launch_ready_groups();
  }
}

void GradientReducer::adopt_grad(std::size_t index) {
  const FlatGroup& group = layout_.groups()[layout_.group_of()[index]];
  const at::Tensor& param = layout_.params()[index];
  adopt_into(param.mutable_grad(),
             internals::flat_alias(group.grad_full, layout_.flat_offset(index), param.sizes()));
}

// A group whose gradients are all in: stage 1 all-reduces the flat buffer
// they are views of; stages 2 and 3 pack them into the wire.
void GradientReducer::prepare(std::size_t g) {
  if (stage_ == 1) return;
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

void GradientReducer::launch_ready_groups() {
  readiness_.launch_ready([this](std::size_t g) {
    if (readiness_.in_backward()) {
      clock_.count(&ZeroOptimizer::CommStats::reductions_launched_in_backward);
    }
    launch(g);
  });
}

void GradientReducer::launch(std::size_t index) {
  // The tasks hold what they use, not the reducer: the queue may still run
  // them while the engine is being destroyed (the layout outlives the queue).
  const FlatGroup* g = &layout_.groups()[index];
  ProcessGroup* pg = &pg_;
  if (stage_ == 1) {
    queue_.submit([pg, g, flat = g->grad_full]() mutable {
      pg->all_reduce(flat, ReduceOp::kAvg);
      if (!g->grad_shard_is_view) {
        torch::NoGradGuard no_grad;
        g->grad_shard.copy_(g->grad_full.narrow(0, g->shard_begin, g->shard_numel));
      }
    });
    return;
  }
  at::Tensor wire = std::move(wire_[index]);
  wire_[index] = at::Tensor();
  queue_.submit([pg, replicate = replicate_, clock = &clock_, layout = &layout_, g, wire,
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

void GradientReducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  readiness_.finish();
  // Parameters that got no gradient this time contribute zeros; their
  // groups launch now, in order, on every rank.
  for (std::size_t i : readiness_.unready()) {
    if (stage_ == 1) adopt_grad(i);
    if (readiness_.arrive(i)) prepare(layout_.group_of()[i]);
  }
  launch_ready_groups();
  clock_.drain(queue_);
  if (stage_ == 3) gatherer_.end_backward();
}

}  // namespace tandem::detail
