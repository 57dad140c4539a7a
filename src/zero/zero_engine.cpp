// Construction, the sharded update and accounting. The layout is in
// zero_layout.cpp, backward in zero_backward.cpp, the stage-3 gather and
// release in zero_units.cpp, checkpoint shards in zero_state.cpp.

#include "zero/zero_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/variable.h>

#include "core/torch_internals.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/parameters.h"
#include "zero/unit_shard.h"

namespace tandem::detail {
ZeroEngine::ZeroEngine(std::shared_ptr<torch::nn::Module> model,
                       torch::optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> pg,
                       ZeroOptions options)
    : model_(std::move(model)),
      optimizer_(optimizer),
      pg_(std::move(pg)),
      options_(options),
      rule_(update_rule_of(optimizer)),
      queue_(pg_.get()) {
  TANDEM_CHECK_ARG(model_ != nullptr && pg_ != nullptr, "ZeroOptimizer: model and process group "
                   "must not be null");
  TANDEM_CHECK_ARG(options_.stage >= 1 && options_.stage <= 3,
                   "ZeroOptimizer: stage must be 1, 2 or 3, got {} (stage 0 is plain DDP: use "
                   "tandem::DistributedDataParallel)",
                   options_.stage);
  TANDEM_CHECK_ARG(!options_.offload_param || options_.stage == 3,
                   "ZeroOptimizer: offload_param needs stage 3 (parameters are partitioned only "
                   "there), got stage {}; set stage to 3 or offload_param to false",
                   options_.stage);
  TANDEM_CHECK_ARG(options_.reduce_bucket_size >= 0,
                   "ZeroOptimizer: reduce_bucket_size must be >= 0, got {}",
                   options_.reduce_bucket_size);
  TANDEM_CHECK_ARG(options_.prefetch_bucket_size >= 0 && options_.max_live_parameters >= 1 &&
                       options_.param_persistence_threshold >= 0,
                   "ZeroOptimizer: prefetch_bucket_size ({}) and param_persistence_threshold "
                   "({}) must be >= 0 and max_live_parameters ({}) >= 1",
                   options_.prefetch_bucket_size, options_.param_persistence_threshold,
                   options_.max_live_parameters);
  world_ = pg_->world_size();
  rank_ = pg_->rank();
  collect_parameters(*model_);
  device_ = params_.front().device();
  state_device_ = options_.offload_optimizer ? c10::Device(c10::kCPU) : device_;
  if (options_.stage == 3) {
    build_unit_groups(*model_);
  } else {
    refuse_memoryless_parameters();
    build_bucket_groups();
  }
  install_hooks();
  log_debug("ZeRO stage {}: {} parameter(s) in {} group(s) over {} rank(s)", options_.stage,
            params_.size(), groups_.size(), world_);
}

ZeroEngine::~ZeroEngine() {
  for (auto& group : groups_) {
    if (group.unit != nullptr) group.unit->attach_sharding(nullptr);
  }
}

void ZeroEngine::step() {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward(), "ZeroOptimizer::step() called during backward");
  drain_timed();
  forward_order_fixed_ = forward_order_fixed_ || !forward_order_.empty();
  ++step_;
  const std::vector<UpdateHyper> hyper = read_hyper(optimizer_, rule_);
  torch::NoGradGuard no_grad;
  for (auto& group : groups_) {
    for (const auto& run : group.runs) {
      std::vector<at::Tensor> state;
      for (auto& s : group.state) state.push_back(s.narrow(0, run.shard_offset, run.length));
      update_shard(rule_, hyper[run.param_group], step_,
                   group.master.narrow(0, run.shard_offset, run.length),
                   group.grad_shard.narrow(0, run.shard_offset, run.length), std::move(state),
                   options_.cpu_adam_threads);
    }
  }
  for (auto& group : groups_) {
    if (!group.master_is_param) {
      at::Tensor target = group.partitioned_params
                              ? group.param_shard
                              : group.full.narrow(0, group.shard_begin, group.shard_numel);
      target.copy_(group.master, /*non_blocking=*/true);
    }
    if (group.partitioned_params) continue;  // the next forward gathers
    at::Tensor shard = group.full.narrow(0, group.shard_begin, group.shard_numel).clone();
    pg_->all_gather_into(group.full, shard);
  }
}

void ZeroEngine::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.drain();
  torch::NoGradGuard no_grad;
  for (auto& group : groups_) {
    if (group.grad_full.defined()) group.grad_full.zero_();
    if (!group.grad_shard_is_view) group.grad_shard.zero_();
  }
  if (options_.stage != 1) {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }
}

double ZeroEngine::grad_norm() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.drain();
  double local = 0.0;
  for (auto& group : groups_) {
    local += group.grad_shard.to(at::kDouble).pow(2).sum().item<double>();
  }
  at::Tensor total = at::full({1}, local, at::TensorOptions().dtype(at::kDouble));
  pg_->all_reduce(total, ReduceOp::kSum);
  return std::sqrt(total.item<double>());
}

double ZeroEngine::clip_grad_norm(double max_norm) {
  TANDEM_CHECK_ARG(max_norm > 0, "clip_grad_norm: max_norm must be positive, got {}", max_norm);
  const double norm = grad_norm();
  // torch::nn::utils::clip_grad_norm_'s rule.
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& group : groups_) group.grad_shard.mul_(coef);
  }
  return norm;
}

std::vector<at::Tensor> ZeroEngine::gradient_shards() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.drain();
  std::vector<at::Tensor> out;
  for (auto& group : groups_) out.push_back(group.grad_shard);
  return out;
}

void ZeroEngine::set_gradient_sync(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!readiness_.in_backward(), "ZeroOptimizer::set_gradient_sync() called during backward");
  sync_enabled_ = enabled;
}

bool ZeroEngine::gradient_sync() const { return sync_enabled_; }

ZeroMemoryStats ZeroEngine::memory_stats() const {
  ZeroMemoryStats stats;
  auto on_host = [&](const at::Tensor& t) {
    return (options_.offload_optimizer || options_.offload_param) && t.is_cpu() ? storage_bytes(t)
                                                                                : 0;
  };
  for (const auto& group : groups_) {
    stats.parameter_bytes += storage_bytes(group.full);
    if (group.partitioned_params) {
      stats.parameter_bytes += storage_bytes(group.param_shard);
      if (options_.offload_param) stats.host_bytes += storage_bytes(group.param_shard);
    }
    stats.gradient_bytes += storage_bytes(group.grad_full);
    if (!group.grad_shard_is_view) {
      stats.gradient_bytes += storage_bytes(group.grad_shard);
      stats.host_bytes += on_host(group.grad_shard);
    }
    if (!group.master_is_param) {
      stats.optimizer_state_bytes += storage_bytes(group.master);
      stats.host_bytes += on_host(group.master);
    }
    for (const auto& s : group.state) {
      stats.optimizer_state_bytes += storage_bytes(s);
      stats.host_bytes += on_host(s);
    }
  }
  stats.gathered_parameter_bytes = live_bytes_;
  stats.peak_gathered_parameter_bytes = peak_live_bytes_;
  // Gradients that autograd holds right now outside the buffers.
  for (const auto& p : params_) {
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    bool in_buffer = false;
    for (const auto& group : groups_) {
      if (group.grad_full.defined() && grad.is_alias_of(group.grad_full)) in_buffer = true;
    }
    if (!in_buffer) stats.gradient_bytes += grad.numel() * grad.element_size();
  }
  return stats;
}

std::vector<std::vector<std::string>> ZeroEngine::group_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& group : groups_) {
    out.emplace_back();
    for (std::size_t i : group.members) out.back().push_back(names_[i]);
  }
  return out;
}

}  // namespace tandem::detail
