// Stage 3: each Sharded unit's parameters are whole only around its forward
// and its backward. A gather fills the unit's flat buffer from every rank's
// shard on the communication thread; the next unit's gather is queued as soon
// as the current one starts (prefetch), in the forward order seen on the
// first pass, reversed for backward. Releasing frees the buffer's storage:
// the parameters and the tensors autograd saved from them are views of it,
// so they see the memory again when the next gather reallocates it.

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "tandem/core/error.h"
#include "zero/zero_engine.h"

namespace tandem::detail {
namespace {

class UnitHooks : public ShardedUnitHooks {
 public:
  UnitHooks(ZeroEngine* engine, std::size_t group) : engine_(engine), group_(group) {}
  void before_forward() override { engine_->unit_before_forward(group_); }
  at::Tensor after_forward(at::Tensor output) override {
    return engine_->unit_after_forward(group_, std::move(output));
  }

 private:
  ZeroEngine* engine_;
  std::size_t group_;
};

}  // namespace

void ZeroEngine::install_unit_hooks() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].unit == nullptr) continue;
    unit_hooks_.push_back(std::make_unique<UnitHooks>(this, g));
    groups_[g].unit->attach_sharding(unit_hooks_.back().get());
  }
}

void ZeroEngine::unit_before_forward(std::size_t index) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (!forward_order_fixed_ &&
      std::find(forward_order_.begin(), forward_order_.end(), index) == forward_order_.end()) {
    forward_order_.push_back(index);
  }
  gather(groups_[index], /*wait=*/true);
  // A checkpointed unit runs its forward again inside backward: the unit
  // after it is done, and must not be gathered again.
  if (options_.prefetch && !recomputing_checkpoint()) {
    const int next = neighbour_in_forward_order(index, +1);
    if (next >= 0) gather(groups_[static_cast<std::size_t>(next)], /*wait=*/false);
  }
}

at::Tensor ZeroEngine::unit_after_forward(std::size_t index, at::Tensor output) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  // A recomputed unit's backward follows at once and needs the parameters:
  // releasing now would only gather them again.
  if (!hold_gathered_ && !recomputing_checkpoint()) release(groups_[index]);
  if (torch::autograd::GradMode::is_enabled() && output.requires_grad()) {
    // Fires once the gradient of the unit's output is complete, i.e. just
    // before autograd runs the unit's own backward.
    output.register_hook([this, index](const at::Tensor&) { unit_before_backward(index); });
  }
  return output;
}

void ZeroEngine::unit_before_backward(std::size_t index) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  gather(groups_[index], /*wait=*/true);
  if (options_.prefetch) {
    const int previous = neighbour_in_forward_order(index, -1);
    if (previous >= 0) gather(groups_[static_cast<std::size_t>(previous)], /*wait=*/false);
  }
}

int ZeroEngine::neighbour_in_forward_order(std::size_t index, int direction) const {
  if (!forward_order_fixed_) return -1;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), index);
  if (it == forward_order_.end()) return -1;
  const auto pos = (it - forward_order_.begin()) + direction;
  if (pos < 0 || pos >= static_cast<std::ptrdiff_t>(forward_order_.size())) return -1;
  return static_cast<int>(forward_order_[static_cast<std::size_t>(pos)]);
}

void ZeroEngine::gather(FlatGroup& group, bool wait) {
  if (!group.partitioned_params) return;
  if (group.params_state == ParamsState::kReleased) {
    internals::reallocate_storage(group.full,
                                  group.padded * static_cast<int64_t>(group.full.element_size()));
    at::Tensor full = group.full;
    at::Tensor shard = group.param_shard;
    group.gather_done = queue_.submit([this, full, shard]() mutable {
      at::Tensor source = shard.device() == full.device() ? shard : shard.to(full.device());
      pg_->all_gather_into(full, source);
    });
    group.params_state = ParamsState::kGathering;
  }
  if (wait && group.params_state == ParamsState::kGathering) {
    group.gather_done.get();
    group.params_state = ParamsState::kWhole;
  }
}

void ZeroEngine::release(FlatGroup& group) {
  if (!group.partitioned_params || group.params_state == ParamsState::kReleased) return;
  if (group.params_state == ParamsState::kGathering) group.gather_done.get();
  internals::release_storage(group.full);
  group.params_state = ParamsState::kReleased;
}

void ZeroEngine::write_back_shard(FlatGroup& group) {
  // Keep what the caller changed while the parameters were whole.
  at::Tensor slice = group.full.narrow(0, group.shard_begin, group.shard_numel);
  at::Tensor current = group.param_shard.device() == slice.device()
                           ? group.param_shard
                           : group.param_shard.to(slice.device());
  if (at::equal(current, slice)) return;
  torch::NoGradGuard no_grad;
  group.param_shard.copy_(slice);
  if (!group.master_is_param) group.master.copy_(group.param_shard);
}

void ZeroEngine::gather_all() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (options_.stage != 3) return;
  TANDEM_CHECK(!hold_gathered_, "ZeroOptimizer: GatheredParameters guards do not nest");
  queue_.drain();
  for (auto& group : groups_) gather(group, /*wait=*/false);
  for (auto& group : groups_) gather(group, /*wait=*/true);
  hold_gathered_ = true;
}

void ZeroEngine::release_all() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (options_.stage != 3) return;
  hold_gathered_ = false;
  for (auto& group : groups_) {
    if (!group.partitioned_params || group.params_state == ParamsState::kReleased) continue;
    gather(group, /*wait=*/true);
    write_back_shard(group);
    release(group);
  }
}

}  // namespace tandem::detail
