// Stage 3: each Sharded unit's parameters are whole only around its forward
// and its backward. A gather fills the unit's flat buffer from every rank's
// shard on the communication thread; the next unit's gather is queued as soon
// as the current one starts (prefetch), in the forward order seen on the
// first pass, reversed for backward. Releasing frees the buffer's storage:
// the parameters and the tensors autograd saved from them are views of it,
// so they see the memory again when the next gather reallocates it.

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "tandem/core/error.h"
#include "zero/sharded_hooks.h"
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
  std::lock_guard<std::mutex> lock(mutex_);
  if (!forward_order_fixed_ &&
      std::find(forward_order_.begin(), forward_order_.end(), index) == forward_order_.end()) {
    forward_order_.push_back(index);
  }
  gather(groups_[index], /*wait=*/true);
  // A checkpointed unit runs its forward again inside backward: the units
  // after it are done, and must not be gathered again.
  if (!recomputing_checkpoint()) prefetch_from(index, +1);
}

at::Tensor ZeroEngine::unit_after_forward(std::size_t index, at::Tensor output) {
  std::lock_guard<std::mutex> lock(mutex_);
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
  std::lock_guard<std::mutex> lock(mutex_);
  gather(groups_[index], /*wait=*/true);
  prefetch_from(index, -1);
}

void ZeroEngine::prefetch_from(std::size_t index, int direction) {
  if (!forward_order_fixed_ || options_.prefetch_bucket_size == 0) return;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), index);
  if (it == forward_order_.end()) return;
  const auto n = static_cast<std::ptrdiff_t>(forward_order_.size());
  int64_t ahead = 0;  // elements gathered (or gathering) ahead of `index`
  for (std::ptrdiff_t pos = (it - forward_order_.begin()) + direction; pos >= 0 && pos < n;
       pos += direction) {
    FlatGroup& next = groups_[forward_order_[static_cast<std::size_t>(pos)]];
    if (ahead + next.padded > options_.prefetch_bucket_size) return;
    ahead += next.padded;
    if (next.params_state != ParamsState::kReleased) continue;
    const int64_t bytes = next.padded * static_cast<int64_t>(next.full.element_size());
    const int64_t limit_bytes =
        options_.max_live_parameters * static_cast<int64_t>(next.full.element_size());
    if (live_bytes_ + bytes > limit_bytes) return;
    gather(next, /*wait=*/false);
  }
}

void ZeroEngine::gather(FlatGroup& group, bool wait) {
  if (!group.partitioned_params) return;
  if (group.params_state == ParamsState::kReleased) {
    const int64_t bytes = group.padded * static_cast<int64_t>(group.full.element_size());
    internals::reallocate_storage(group.full, bytes);
    live_bytes_ += bytes;
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
    at::Tensor full = group.full;
    at::Tensor shard = group.param_shard;
    group.gather_done = queue_.submit([this, full, shard]() mutable {
      const auto start = std::chrono::steady_clock::now();
      at::Tensor source = shard.device() == full.device() ? shard : shard.to(full.device());
      pg_->all_gather_into(full, source);
      count_comm(&ZeroOptimizer::CommStats::gather_seconds, start);
    });
    group.params_state = ParamsState::kGathering;
  }
  if (wait && group.params_state == ParamsState::kGathering) {
    const auto start = std::chrono::steady_clock::now();
    group.gather_done.get();
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    std::lock_guard<std::mutex> lock(stats_mutex_);
    comm_.gather_wait_seconds += waited.count();
    group.params_state = ParamsState::kWhole;
  }
}

void ZeroEngine::release(FlatGroup& group) {
  if (!group.partitioned_params || group.params_state == ParamsState::kReleased) return;
  if (group.params_state == ParamsState::kGathering) group.gather_done.get();
  internals::release_storage(group.full);
  live_bytes_ -= group.padded * static_cast<int64_t>(group.full.element_size());
  group.params_state = ParamsState::kReleased;
}

void ZeroEngine::count_comm(double ZeroOptimizer::CommStats::*field,
                            std::chrono::steady_clock::time_point start) {
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  comm_.*field += took.count();
  if (field == &ZeroOptimizer::CommStats::gather_seconds) ++comm_.gathers;
  if (field == &ZeroOptimizer::CommStats::reduce_scatter_seconds) ++comm_.reduce_scatters;
}

void ZeroEngine::drain_timed() {
  const auto start = std::chrono::steady_clock::now();
  queue_.drain();
  const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
  std::lock_guard<std::mutex> lock(stats_mutex_);
  comm_.drain_wait_seconds += waited.count();
}

ZeroOptimizer::CommStats ZeroEngine::comm_stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return comm_;
}

void ZeroEngine::reset_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_live_bytes_ = live_bytes_;
  std::lock_guard<std::mutex> stats_lock(stats_mutex_);
  comm_ = ZeroOptimizer::CommStats();
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
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.stage != 3) return;
  TANDEM_CHECK(!hold_gathered_, "ZeroOptimizer: GatheredParameters guards do not nest");
  queue_.drain();
  for (auto& group : groups_) gather(group, /*wait=*/false);
  for (auto& group : groups_) gather(group, /*wait=*/true);
  hold_gathered_ = true;
}

void ZeroEngine::release_all() {
  std::lock_guard<std::mutex> lock(mutex_);
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
