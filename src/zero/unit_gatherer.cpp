// Stage 3: a gather fills a unit's flat buffer from every rank's shard on the
// communication thread; the next unit's gather is queued as soon as the
// current one starts (prefetch), in the forward order seen on the first
// pass, reversed for backward. Releasing frees the buffer's storage: the
// parameters and the tensors autograd saved from them are views of it, so
// they see the memory again when the next gather reallocates it.

#include "zero/unit_gatherer.h"

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "tandem/core/error.h"
#include "tandem/zero/sharded.h"

namespace tandem::detail {
namespace {

class UnitHooks : public ShardedUnitHooks {
 public:
  UnitHooks(UnitGatherer* gatherer, std::size_t group) : gatherer_(gatherer), group_(group) {}
  void before_forward() override { gatherer_->before_forward(group_); }
  at::Tensor after_forward(at::Tensor output) override {
    return gatherer_->after_forward(group_, std::move(output));
  }

 private:
  UnitGatherer* gatherer_;
  std::size_t group_;
};

}  // namespace

UnitGatherer::UnitGatherer(const ZeroLayout& layout, ProcessGroup& pg, CommQueue& queue,
                           CommClock& clock, const ZeroOptions& options)
    : layout_(layout), pg_(pg), queue_(queue), clock_(clock), options_(options) {
  const auto& groups = layout_.groups();
  units_.resize(groups.size());
  held_count_.assign(groups.size(), 0);
  kept_.resize(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    // The layout released each unit's buffer once its shard was kept.
    if (groups[g].partitioned_params) units_[g].state = State::kReleased;
    if (groups[g].unit == nullptr) continue;
    hooks_.push_back(std::make_unique<UnitHooks>(this, g));
    groups[g].unit->attach_sharding(hooks_.back().get());
  }
}

UnitGatherer::~UnitGatherer() {
  for (const auto& group : layout_.groups()) {
    if (group.unit != nullptr) group.unit->attach_sharding(nullptr);
  }
}

void UnitGatherer::before_forward(std::size_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!forward_order_fixed_ &&
      std::find(forward_order_.begin(), forward_order_.end(), group) == forward_order_.end()) {
    forward_order_.push_back(group);
  }
  gather(group, /*wait=*/true);
  // A checkpointed unit runs its forward again inside backward: the units
  // after it are done, and must not be gathered again.
  if (!recomputing_checkpoint()) prefetch_from(group, +1);
}

at::Tensor UnitGatherer::after_forward(std::size_t group, at::Tensor output) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A recomputed unit's backward follows at once and needs the parameters:
  // releasing now would only gather them again.
  if (!held(group) && !recomputing_checkpoint()) release_locked(group);
  if (torch::autograd::GradMode::is_enabled() && output.requires_grad()) {
    // Fires once the gradient of the unit's output is complete, i.e. just
    // before autograd runs the unit's own backward.
    output.register_hook([this, group](const at::Tensor&) { before_backward(group); });
  }
  return output;
}

void UnitGatherer::before_backward(std::size_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  gather(group, /*wait=*/true);
  prefetch_from(group, -1);
}

void UnitGatherer::prefetch_from(std::size_t group, int direction) {
  if (!forward_order_fixed_ || options_.prefetch_bucket_size == 0) return;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), group);
  if (it == forward_order_.end()) return;
  const auto n = static_cast<std::ptrdiff_t>(forward_order_.size());
  int64_t ahead = 0;  // elements gathered (or gathering) ahead of `group`
  for (std::ptrdiff_t pos = (it - forward_order_.begin()) + direction; pos >= 0 && pos < n;
       pos += direction) {
    const std::size_t g = forward_order_[static_cast<std::size_t>(pos)];
    const FlatGroup& next = layout_.groups()[g];
    if (ahead + next.padded > options_.prefetch_bucket_size) return;
    ahead += next.padded;
    if (units_[g].state != State::kReleased) continue;
    const int64_t bytes = next.padded * static_cast<int64_t>(next.full.element_size());
    const int64_t limit_bytes =
        options_.max_live_parameters * static_cast<int64_t>(next.full.element_size());
    if (live_bytes_ + bytes > limit_bytes) return;
    gather(g, /*wait=*/false);
  }
}

void UnitGatherer::all_gather_whole(at::Tensor& full, const at::Tensor& shard) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t calls = bucketed_all_gather(pg_, full, shard, options_.allgather_bucket_size);
  clock_.add_since(&ZeroOptimizer::CommStats::update_gather_seconds, start);
  for (int64_t i = 0; i < calls; ++i) {
    clock_.count(&ZeroOptimizer::CommStats::parameter_all_gather_calls);
  }
}

void UnitGatherer::gather(std::size_t g, bool wait) {
  const FlatGroup& group = layout_.groups()[g];
  Unit& unit = units_[g];
  if (!group.partitioned_params) return;
  if (unit.state == State::kReleased) {
    const int64_t bytes = group.padded * static_cast<int64_t>(group.full.element_size());
    internals::reallocate_storage(group.full, bytes);
    live_bytes_ += bytes;
    peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
    // The task holds what it uses, not the gatherer: the queue may still run
    // it while the engine is being destroyed.
    unit.gathered = queue_.submit(
        [pg = &pg_, clock = &clock_, full = group.full, shard = group.param_shard,
         bucket = options_.allgather_bucket_size]() mutable {
          const auto start = std::chrono::steady_clock::now();
          at::Tensor source = shard.device() == full.device() ? shard : shard.to(full.device());
          const int64_t calls = bucketed_all_gather(*pg, full, source, bucket);
          clock->add_since(&ZeroOptimizer::CommStats::gather_seconds, start);
          for (int64_t i = 0; i < calls; ++i) {
            clock->count(&ZeroOptimizer::CommStats::parameter_all_gather_calls);
          }
          clock->add_bytes(&ZeroOptimizer::CommStats::gather_bytes,
                           full.numel() * static_cast<int64_t>(full.element_size()));
        });
    unit.state = State::kGathering;
  }
  if (wait && unit.state == State::kGathering) {
    const auto start = std::chrono::steady_clock::now();
    unit.gathered.get();
    clock_.add_since(&ZeroOptimizer::CommStats::gather_wait_seconds, start);
    unit.state = State::kWhole;
  }
}

void UnitGatherer::release(std::size_t group) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_locked(group);
}

void UnitGatherer::release_locked(std::size_t g) {
  const FlatGroup& group = layout_.groups()[g];
  Unit& unit = units_[g];
  if (!group.partitioned_params || unit.state == State::kReleased) return;
  if (unit.state == State::kGathering) unit.gathered.get();
  internals::release_storage(group.full);
  live_bytes_ -= group.padded * static_cast<int64_t>(group.full.element_size());
  unit.state = State::kReleased;
}

at::Tensor UnitGatherer::take_whole(std::size_t g) {
  std::lock_guard<std::mutex> lock(mutex_);
  const FlatGroup& group = layout_.groups()[g];
  const bool reuse = group.partitioned_params && units_[g].state == State::kWhole &&
                     group.full.scalar_type() == at::kFloat &&
                     group.full.device() == layout_.device();
  if (!reuse) return at::Tensor();
  at::Tensor memory = internals::take_storage(group.full);
  live_bytes_ -= group.padded * static_cast<int64_t>(sizeof(float));
  units_[g].state = State::kReleased;
  return memory;
}

void UnitGatherer::settle_forward_order() {
  std::lock_guard<std::mutex> lock(mutex_);
  forward_order_fixed_ = forward_order_fixed_ || !forward_order_.empty();
}

void UnitGatherer::end_backward() {
  if (!layout_.plan().partition_parameters) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t g = 0; g < units_.size(); ++g) {
    if (layout_.groups()[g].partitioned_params && !held(g)) release_locked(g);
  }
  forward_order_fixed_ = forward_order_fixed_ || !forward_order_.empty();
}

void UnitGatherer::write_back_shard(std::size_t g) {
  // Keep what the caller changed while the parameters were whole.
  const FlatGroup& group = layout_.groups()[g];
  at::Tensor slice = group.full.narrow(0, group.shard_begin, group.shard_numel);
  if (!group.partitioned_params) {
    // Always whole: only a separate fp32 master has to follow.
    torch::NoGradGuard no_grad;
    if (!group.master_is_param) group.master.copy_(slice);
    return;
  }
  at::Tensor current = group.param_shard.device() == slice.device()
                           ? group.param_shard
                           : group.param_shard.to(slice.device());
  if (at::equal(current, slice)) return;
  torch::NoGradGuard no_grad;
  group.param_shard.copy_(slice);
  if (!group.master_is_param) group.master.copy_(group.param_shard);
}

void UnitGatherer::gather_all() {
  std::vector<std::size_t> all(units_.size());
  for (std::size_t g = 0; g < all.size(); ++g) all[g] = g;
  hold(std::move(all), /*every=*/true);
}

void UnitGatherer::release_all() { release_hold(std::nullopt); }

void UnitGatherer::gather_groups(const std::vector<std::size_t>& groups) {
  hold(groups, /*every=*/false);
}

void UnitGatherer::release_held(std::optional<int> modifier_rank) { release_hold(modifier_rank); }

void UnitGatherer::hold(std::vector<std::size_t> groups, bool every) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!layout_.plan().partition_parameters) return;
  queue_.drain();
  for (std::size_t g : groups) {
    // A group outside the partitioned units is always whole: its values as
    // the outermost guard found them, to put back if that guard discards.
    if (held_count_[g]++ == 0 && !layout_.groups()[g].partitioned_params && !every) {
      kept_[g] = layout_.groups()[g].full.clone();
    }
  }
  for (std::size_t g : groups) gather(g, /*wait=*/false);
  for (std::size_t g : groups) gather(g, /*wait=*/true);
  holds_.push_back({std::move(groups), every});
}

void UnitGatherer::release_hold(std::optional<int> modifier_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!layout_.plan().partition_parameters || holds_.empty()) return;
  const Hold frame = std::move(holds_.back());  // guards are scoped: the innermost ends first
  holds_.pop_back();
  for (std::size_t g : frame.groups) {
    const FlatGroup& group = layout_.groups()[g];
    gather(g, /*wait=*/true);  // whole already; waits for a gather still in flight
    if (modifier_rank) {
      // DeepSpeed's modifier_rank: that rank's values, on every rank.
      at::Tensor full = group.full;
      pg_.broadcast(full, *modifier_rank);
      write_back_shard(g);
    } else if (frame.every) {
      write_back_shard(g);  // GatheredParameters(zero): each rank keeps its changes
    }
    if (--held_count_[g] > 0) continue;  // an outer guard still holds it
    if (group.partitioned_params) {
      release_locked(g);  // without a write-back the shards were never touched
    } else {
      if (kept_[g].defined() && !modifier_rank && !frame.every) {
        torch::NoGradGuard no_grad;
        group.full.copy_(kept_[g]);  // discarded, as the units' changes are
      }
      kept_[g] = at::Tensor();
    }
  }
}

bool UnitGatherer::holding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !holds_.empty();
}

void UnitGatherer::for_each_whole_parameter(
    const std::function<void(const std::string&, const at::Tensor&)>& fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.drain();
  for (std::size_t g = 0; g < units_.size(); ++g) {
    const bool was_released = units_[g].state == State::kReleased;
    gather(g, /*wait=*/true);
    for (std::size_t i : layout_.groups()[g].members) fn(layout_.name(i), layout_.params()[i]);
    if (was_released) release_locked(g);
  }
}

int64_t UnitGatherer::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_bytes_;
}

int64_t UnitGatherer::peak_live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_live_bytes_;
}

void UnitGatherer::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_live_bytes_ = live_bytes_;
}

}  // namespace tandem::detail
