// Construction, the sharded update and accounting. Backward is in
// zero_backward.cpp, the stage-3 gather/release in zero_units.cpp.

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

namespace tandem::detail {
namespace {

constexpr std::size_t kNoGroup = std::numeric_limits<std::size_t>::max();

}  // namespace

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
  world_ = pg_->world_size();
  rank_ = pg_->rank();
  collect_parameters(*model_);
  device_ = params_.front().device();
  state_device_ = options_.offload_optimizer ? c10::Device(c10::kCPU) : device_;
  if (options_.stage == 3) {
    build_unit_groups(*model_);
  } else {
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

void ZeroEngine::collect_parameters(torch::nn::Module& model) {
  // Tied weights once: one slot in the flat buffers, one gradient, one update.
  std::unordered_map<const void*, std::size_t> seen;
  for (const auto& item : unique_named_parameters(model)) {
    const at::Tensor& p = item.tensor;
    if (!p.requires_grad()) continue;
    seen.emplace(p.unsafeGetTensorImpl(), params_.size());
    TANDEM_CHECK_ARG(p.is_contiguous() && !p.is_sparse(),
                     "ZeroOptimizer: parameter '{}' is not a dense contiguous tensor; ZeRO "
                     "flattens parameters into shared buffers",
                     item.name);
    params_.push_back(p);
    names_.push_back(item.name);
  }
  TANDEM_CHECK_ARG(!params_.empty(), "ZeroOptimizer: the model has no trainable parameters");
  for (std::size_t i = 1; i < params_.size(); ++i) {
    TANDEM_CHECK_ARG(params_[i].device() == params_[0].device(),
                     "ZeroOptimizer: parameters '{}' ({}) and '{}' ({}) are on different "
                     "devices; move the model to one device before sharding it",
                     names_[0], params_[0].device().str(), names_[i], params_[i].device().str());
  }
  // Which optimizer param group updates each parameter.
  param_group_of_.assign(params_.size(), kNoGroup);
  auto& groups = optimizer_.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      auto it = seen.find(p.unsafeGetTensorImpl());
      TANDEM_CHECK_ARG(it != seen.end(),
                       "ZeroOptimizer: the optimizer holds a tensor of shape {} that is not a "
                       "trainable parameter of the model. Build the optimizer over "
                       "model->parameters() (and prepare the optimizer before any master "
                       "weights replace them)",
                       fmt::join(p.sizes(), "x"));
      param_group_of_[it->second] = g;
    }
  }
}

void ZeroEngine::build_bucket_groups() {
  // Gradients arrive roughly in reverse registration order: bucket that way.
  std::vector<std::size_t> members;
  int64_t filled = 0;
  auto flush = [&] {
    if (members.empty()) return;
    FlatGroup group;
    group.members = std::move(members);
    members.clear();
    filled = 0;
    groups_.push_back(std::move(group));
  };
  for (std::size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    if (!members.empty() && (filled + p.numel() > options_.reduce_bucket_size ||
                             params_[members.front()].scalar_type() != p.scalar_type())) {
      flush();
    }
    members.push_back(k);
    filled += p.numel();
  }
  flush();
  for (auto& group : groups_) finish_group(group);
}

void ZeroEngine::build_unit_groups(torch::nn::Module& model) {
  // Each parameter belongs to the innermost unit around it: modules() is in
  // pre-order, so a nested unit overwrites its ancestor's claim. A unit may
  // claim a tensor only if every registration of it lies inside the unit: a
  // weight tied across two units, or between a unit and the rest of the model,
  // is used while the unit's shards are not gathered, so it stays whole.
  std::unordered_map<const void*, std::size_t> index_of;
  for (std::size_t i = 0; i < params_.size(); ++i) index_of[params_[i].unsafeGetTensorImpl()] = i;
  auto registrations = [&](const torch::nn::Module& m) {
    std::vector<int> count(params_.size(), 0);
    for (const auto& item : m.named_parameters(/*recurse=*/true)) {
      auto it = index_of.find(item.value().unsafeGetTensorImpl());
      if (it != index_of.end()) ++count[it->second];
    }
    return count;
  };
  const std::vector<int> everywhere = registrations(model);
  std::vector<ShardedUnit*> units;
  std::vector<std::size_t> unit_of(params_.size(), kNoGroup);
  for (const auto& module : model.modules(/*include_self=*/true)) {
    auto* unit = dynamic_cast<ShardedUnit*>(module.get());
    if (unit == nullptr) continue;
    TANDEM_CHECK_ARG(!unit->sharding_attached(),
                     "ZeroOptimizer: a Sharded unit of this model is already owned by another "
                     "ZeroOptimizer; one ZeRO optimizer per model");
    const std::vector<int> inside = registrations(*module);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (inside[i] > 0 && inside[i] == everywhere[i]) unit_of[i] = units.size();
    }
    units.push_back(unit);
  }
  TANDEM_CHECK_ARG(!units.empty(),
                   "ZeroOptimizer: stage 3 found no tandem::Sharded unit in the model, so no "
                   "parameter would be partitioned. Declare the blocks to shard as "
                   "tandem::Sharded<BlockImpl> (see tandem/zero/sharded.h), or use stage 2");
  // Launch order: units in reverse forward order, then the loose parameters.
  for (std::size_t u = units.size(); u-- > 0;) {
    FlatGroup group;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (unit_of[i] == u) group.members.push_back(i);
    }
    if (group.members.empty()) continue;
    group.unit = units[u];
    group.partitioned_params = true;
    groups_.push_back(std::move(group));
  }
  FlatGroup loose;
  for (std::size_t i = params_.size(); i-- > 0;) {
    if (unit_of[i] == kNoGroup) loose.members.push_back(i);
  }
  if (!loose.members.empty()) groups_.push_back(std::move(loose));
  for (auto& group : groups_) finish_group(group);
}

void ZeroEngine::finish_group(FlatGroup& group) {
  std::vector<int64_t> numels;
  const at::Tensor& first = params_[group.members.front()];
  for (std::size_t i : group.members) {
    TANDEM_CHECK_ARG(params_[i].scalar_type() == first.scalar_type(),
                     "ZeroOptimizer: parameters '{}' ({}) and '{}' ({}) share a stage-3 unit "
                     "but not a dtype; keep each Sharded unit in one dtype",
                     names_[group.members.front()], c10::toString(first.scalar_type()), names_[i],
                     c10::toString(params_[i].scalar_type()));
    numels.push_back(params_[i].numel());
  }
  lay_out(group, numels, world_, rank_);
  const auto dtype = first.scalar_type();
  const auto fp32 = at::TensorOptions().dtype(at::kFloat);
  torch::NoGradGuard no_grad;
  group.full = at::zeros({group.padded}, first.options().requires_grad(false));
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    at::Tensor& p = params_[group.members[k]];
    at::Tensor view = internals::flat_alias(group.full, group.offsets[k], p.sizes());
    view.copy_(p);
    internals::rebind_parameter_data(p, view);
  }
  pg_->broadcast(group.full, 0);  // every rank starts from rank 0's values
  at::Tensor my_slice = group.full.narrow(0, group.shard_begin, group.shard_numel);
  const bool fp32_params = dtype == at::kFloat;
  if (group.partitioned_params) {
    group.param_shard = my_slice.clone();
    if (options_.offload_param) group.param_shard = to_state_device(group.param_shard);
    group.master_is_param = fp32_params && group.param_shard.device() == state_device_;
    internals::release_storage(group.full);
    group.params_state = ParamsState::kReleased;
  } else {
    group.master_is_param = fp32_params && !options_.offload_optimizer;
  }
  if (group.master_is_param) {
    group.master = group.partitioned_params ? group.param_shard : my_slice;
  } else {
    group.master = empty_state(group.shard_numel);
    group.master.copy_(group.partitioned_params ? group.param_shard : my_slice);
  }
  if (options_.stage == 1) {
    group.grad_full = at::zeros({group.padded}, first.options().requires_grad(false));
    group.grad_shard_is_view = fp32_params && !options_.offload_optimizer;
    group.grad_shard = group.grad_shard_is_view
                           ? group.grad_full.narrow(0, group.shard_begin, group.shard_numel)
                           : empty_state(group.shard_numel).zero_();
  } else {
    group.grad_shard = empty_state(group.shard_numel).zero_();
  }
  const int states = state_count(rule_, read_hyper(optimizer_, rule_));
  for (int s = 0; s < states; ++s) group.state.push_back(empty_state(group.shard_numel).zero_());
  build_runs(group);
  (void)fp32;
}

void ZeroEngine::build_runs(FlatGroup& group) {
  group.runs.clear();
  for (const auto& seg : group.segments) {
    const std::size_t pg = param_group_of_[seg.param];
    if (pg == kNoGroup) continue;  // not in the optimizer: never updated
    if (!group.runs.empty() && group.runs.back().param_group == pg &&
        group.runs.back().shard_offset + group.runs.back().length == seg.shard_offset) {
      group.runs.back().length += seg.length;
    } else {
      group.runs.push_back({pg, seg.shard_offset, seg.length});
    }
  }
}

at::Tensor ZeroEngine::empty_state(int64_t n) const {
  auto options = at::TensorOptions().dtype(at::kFloat).device(state_device_);
  // Host buffers that feed or receive device copies are pinned, so the
  // copies run asynchronously.
  const bool pin = state_device_.is_cpu() && device_.is_cuda() && options_.pin_memory;
  return at::empty({n}, options.pinned_memory(pin));
}

at::Tensor ZeroEngine::to_state_device(const at::Tensor& t) const {
  if (t.device() == state_device_) return t;
  at::Tensor out = at::empty(t.sizes(), t.options().device(state_device_).pinned_memory(
                                            state_device_.is_cpu() && options_.pin_memory));
  out.copy_(t);
  return out;
}

void ZeroEngine::step() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  TANDEM_CHECK(!in_backward_, "ZeroOptimizer::step() called during backward");
  queue_.drain();
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
  std::lock_guard<std::recursive_mutex> lock(mutex_);
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
  std::lock_guard<std::recursive_mutex> lock(mutex_);
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
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  queue_.drain();
  std::vector<at::Tensor> out;
  for (auto& group : groups_) out.push_back(group.grad_shard);
  return out;
}

void ZeroEngine::set_gradient_sync(bool enabled) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  TANDEM_CHECK(!in_backward_, "ZeroOptimizer::set_gradient_sync() called during backward");
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
