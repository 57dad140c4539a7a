// Checkpoint access to the shards: what this rank owns, by parameter and
// element range, so that a checkpoint written at one world size (or by DDP)
// loads at any other (see tandem/checkpoint/checkpoint.h).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tandem/core/error.h"
#include "zero/zero_engine.h"

namespace tandem::detail {
namespace {

// The parameter values of `group` that this rank owns, as one shard-long
// tensor (views, never copies).
at::Tensor value_shard(const FlatGroup& group) {
  return group.partitioned_params ? group.param_shard
                                  : group.full.narrow(0, group.shard_begin, group.shard_numel);
}

}  // namespace

std::vector<std::string> ZeroEngine::state_names() const {
  const int count = groups_.empty() ? 0 : static_cast<int>(groups_.front().state.size());
  if (rule_ == UpdateRule::kSgd) {
    return count == 1 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  }
  return {"exp_avg", "exp_avg_sq"};
}

std::vector<ZeroOptimizer::ShardFragment> ZeroEngine::shard_fragments() const {
  std::vector<ZeroOptimizer::ShardFragment> out;
  for (const auto& group : groups_) {
    const at::Tensor values = value_shard(group);
    for (const auto& seg : group.segments) {
      ZeroOptimizer::ShardFragment f;
      f.name = names_[seg.param];
      f.begin = seg.param_offset;
      f.value = values.narrow(0, seg.shard_offset, seg.length);
      if (!group.master_is_param) f.master = group.master.narrow(0, seg.shard_offset, seg.length);
      for (const auto& s : group.state) f.state.push_back(s.narrow(0, seg.shard_offset, seg.length));
      out.push_back(std::move(f));
    }
  }
  return out;
}

void ZeroEngine::load_shards(const ZeroOptimizer::FragmentSource& source, int64_t step_count) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward() && !hold_gathered_,
               "ZeroOptimizer::load_shards() must run between steps, outside "
               "GatheredParameters");
  queue_.drain();
  const std::vector<std::string> states = state_names();
  torch::NoGradGuard no_grad;
  for (auto& group : groups_) {
    at::Tensor values = value_shard(group);
    for (const auto& seg : group.segments) {
      const std::string& name = names_[seg.param];
      at::Tensor value = source("model", name, seg.param_offset, seg.length);
      TANDEM_CHECK(value.defined(), "checkpoint has no values for parameter '{}'", name);
      values.narrow(0, seg.shard_offset, seg.length).copy_(value);
      if (!group.master_is_param) {
        at::Tensor master = source("master", name, seg.param_offset, seg.length);
        group.master.narrow(0, seg.shard_offset, seg.length)
            .copy_(master.defined() ? master : value);
      }
      for (std::size_t s = 0; s < states.size(); ++s) {
        at::Tensor state = source(states[s], name, seg.param_offset, seg.length);
        at::Tensor target = group.state[s].narrow(0, seg.shard_offset, seg.length);
        if (state.defined()) {
          target.copy_(state);
        } else {
          target.zero_();
        }
      }
    }
    group.grad_shard.zero_();
    if (group.grad_full.defined()) group.grad_full.zero_();
    reassemble(group, values);
  }
  step_ = step_count;
}

void ZeroEngine::load_parameter_shards(const ZeroOptimizer::ShardFill& fill) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward() && !hold_gathered_,
               "ZeroOptimizer::load_parameter_shards() must run between steps, outside "
               "GatheredParameters");
  queue_.drain();
  torch::NoGradGuard no_grad;
  for (auto& group : groups_) {
    at::Tensor values = value_shard(group);
    for (const auto& seg : group.segments) {
      // Into the fp32 master when there is one, so an fp32 file keeps its
      // precision there; the parameter gets its rounding of it.
      at::Tensor value = values.narrow(0, seg.shard_offset, seg.length);
      at::Tensor target =
          group.master_is_param ? value : group.master.narrow(0, seg.shard_offset, seg.length);
      if (fill(names_[seg.param], seg.param_offset, target) && !group.master_is_param) {
        value.copy_(target);
      }
    }
    reassemble(group, values);
  }
}

void ZeroEngine::reassemble(FlatGroup& group, const at::Tensor& values) {
  if (!group.partitioned_params) {
    at::Tensor shard = values.clone();
    pg_->all_gather_into(group.full, shard);
  } else if (group.params_state != ParamsState::kReleased) {
    release(group);
  }
}

void ZeroEngine::for_each_whole_parameter(
    const std::function<void(const std::string&, const at::Tensor&)>& fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward(), "ZeroOptimizer::for_each_whole_parameter() called during backward");
  queue_.drain();
  for (auto& group : groups_) {
    const bool was_released = group.params_state == ParamsState::kReleased;
    gather(group, /*wait=*/true);
    for (std::size_t i : group.members) fn(names_[i], params_[i]);
    if (was_released) release(group);
  }
}

}  // namespace tandem::detail
