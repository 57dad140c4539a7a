// Backward under ZeRO: as each group's gradients complete, stage 1 all-reduces
// its flat gradient buffer (DDP's scheme) and stages 2 and 3 pack the
// gradients, free them, and reduce-scatter the pack into this rank's fp32
// shard, all on the communication thread while backward goes on.

#include <chrono>

#include <ATen/ATen.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "parallel/flat_grad.h"
#include "tandem/core/error.h"
#include "zero/zero_engine.h"

namespace tandem::detail {

void ZeroEngine::install_hooks() {
  group_of_.assign(params_.size(), 0);
  flat_offset_.assign(params_.size(), 0);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t k = 0; k < groups_[g].members.size(); ++k) {
      group_of_[groups_[g].members[k]] = g;
      flat_offset_[groups_[g].members[k]] = groups_[g].offsets[k];
    }
  }
  readiness_.reset(group_of_, groups_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    grad_hooks_.push_back(
        internals::add_grad_ready_hook(params_[i], [this, i] { on_grad_ready(i); }));
  }
  install_unit_hooks();
}

void ZeroEngine::on_grad_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.stage == 1 && !sync_enabled_) return;  // accumulate locally, as DDP's no_sync
  if (readiness_.start_if_idle()) {
    // Not Engine::queue_callback: inside a checkpointed block's nested
    // backward that would finalize when the block's backward ends, not the
    // model's.
    queue_end_of_backward([this] { finalize_backward(); });
  }
  if (!readiness_.mark_ready(index)) return;
  if (options_.stage == 1) adopt_grad(index);
  if (readiness_.arrive(index)) {
    prepare(groups_[group_of_[index]]);
    launch_ready_groups();
  }
}

void ZeroEngine::adopt_grad(std::size_t index) {
  const FlatGroup& group = groups_[group_of_[index]];
  adopt_into(params_[index].mutable_grad(),
             internals::flat_alias(group.grad_full, flat_offset_[index], params_[index].sizes()));
}

// A group whose gradients are all in: stage 1 all-reduces the flat buffer
// they are views of; stages 2 and 3 pack them into the wire.
void ZeroEngine::prepare(FlatGroup& group) {
  if (options_.stage == 1) return;
  torch::NoGradGuard no_grad;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  // A stage-3 unit's gathered fp32 parameters are freed here anyway: their
  // memory, the wire's exact size, takes the packed gradients instead of a
  // second buffer of the unit's size.
  const bool reuse = group.partitioned_params && group.params_state == ParamsState::kWhole &&
                     group.full.scalar_type() == at::kFloat && group.full.device() == device_;
  if (reuse) {
    group.wire = internals::take_storage(group.full);
    live_bytes_ -= group.padded * static_cast<int64_t>(sizeof(float));
    group.params_state = ParamsState::kReleased;
  } else {
    group.wire = at::empty({group.padded}, fp32);
  }
  int64_t packed_end = 0;  // zero what no gradient fills: unused members, padding
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    at::Tensor& grad = params_[group.members[k]].mutable_grad();
    const int64_t numel = params_[group.members[k]].numel();
    if (!grad.defined()) {  // unused this step: contributes zeros
      group.wire.narrow(0, group.offsets[k], numel).zero_();
    } else {
      group.wire.narrow(0, group.offsets[k], numel).copy_(grad.reshape({-1}));
      grad = at::Tensor();  // the full gradient lives no longer than its bucket
    }
    packed_end = group.offsets[k] + numel;
  }
  group.wire.narrow(0, packed_end, group.padded - packed_end).zero_();
  if (group.partitioned_params) release(group);
}

void ZeroEngine::launch_ready_groups() {
  readiness_.launch_ready([this](std::size_t g) { launch(groups_[g]); });
}

void ZeroEngine::launch(FlatGroup& group) {
  FlatGroup* g = &group;
  if (options_.stage == 1) {
    queue_.submit([this, g] {
      pg_->all_reduce(g->grad_full, ReduceOp::kAvg);
      if (!g->grad_shard_is_view) {
        torch::NoGradGuard no_grad;
        g->grad_shard.copy_(g->grad_full.narrow(0, g->shard_begin, g->shard_numel));
      }
    });
    return;
  }
  at::Tensor wire = std::move(group.wire);
  group.wire = at::Tensor();
  queue_.submit([this, g, wire] {
    torch::NoGradGuard no_grad;
    at::Tensor shard = at::empty({g->shard_numel}, wire.options());
    const auto start = std::chrono::steady_clock::now();
    pg_->reduce_scatter(shard, wire, ReduceOp::kAvg);
    count_comm(&ZeroOptimizer::CommStats::reduce_scatter_seconds, start);
    // Micro-steps accumulate into the shard until zero_grad().
    if (shard.device() == g->grad_shard.device()) {
      g->grad_shard.add_(shard);
    } else {
      g->grad_shard.add_(shard.to(g->grad_shard.device()));
    }
  });
}

void ZeroEngine::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  readiness_.finish();
  // Parameters that got no gradient this time contribute zeros; their
  // groups launch now, in order, on every rank.
  for (std::size_t i : readiness_.unready()) {
    if (options_.stage == 1) adopt_grad(i);
    if (readiness_.arrive(i)) prepare(groups_[group_of_[i]]);
  }
  launch_ready_groups();
  drain_timed();
  if (options_.stage == 3) {
    if (!hold_gathered_) {
      for (auto& group : groups_) {
        if (group.partitioned_params) release(group);
      }
    }
    forward_order_fixed_ = forward_order_fixed_ || !forward_order_.empty();
  }
}

}  // namespace tandem::detail
