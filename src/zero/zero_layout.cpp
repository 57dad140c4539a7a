// Laying the model out: which trainable parameters go into which flat group
// (gradient buckets for stages 1 and 2, one group per Sharded unit plus the
// loose parameters for stage 3), each group's offsets and this rank's shard,
// and the buffers of the fp32 masters, gradient shards and optimizer state.
// Adopting units cut by zero::Init is in zero_adopt.cpp.

#include "zero/zero_layout.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/torch_internals.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/core/logging.h"
#include "zero/auto_unit.h"
#include "zero/unit_shard.h"

namespace tandem::detail {
namespace {

constexpr std::size_t kNoGroup = ZeroLayout::kNotOptimized;

}  // namespace

ZeroLayout::ZeroLayout(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                       ProcessGroup& pg, ProcessGroup* replicate, const ZeroOptions& options,
                       ShardingPlan plan, UpdateRule rule)
    : options_(options), plan_(plan), world_(pg.world_size()), rank_(pg.rank()) {
  collect_parameters(model, optimizer);
  device_ = params_.front().device();
  state_device_ = options_.offload_optimizer ? c10::Device(c10::kCPU) : device_;
  if (plan_.partition_parameters) {
    build_unit_groups(model, pg);
  } else {
    refuse_memoryless_parameters();
    build_bucket_groups();
  }
  for (auto& group : groups_) finish_group(group, pg, replicate, optimizer, rule);
  group_of_.assign(params_.size(), 0);
  flat_offset_.assign(params_.size(), 0);
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t k = 0; k < groups_[g].members.size(); ++k) {
      group_of_[groups_[g].members[k]] = g;
      flat_offset_[groups_[g].members[k]] = groups_[g].offsets[k];
    }
  }
}

void ZeroLayout::collect_parameters(torch::nn::Module& model,
                                    torch::optim::Optimizer& optimizer) {
  // Tied weights once: one slot in the flat buffers, one gradient, one update.
  std::unordered_map<const void*, std::size_t> seen;
  std::unordered_map<const void*, bool> frozen;
  for (const auto& item : unique_named_parameters(model)) {
    const at::Tensor& p = item.tensor;
    if (!p.requires_grad()) {
      if (frozen.emplace(p.unsafeGetTensorImpl(), true).second) frozen_params_.push_back(p);
      continue;
    }
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
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& p : groups[g].params()) {
      // A frozen parameter listed in the optimizer (model->parameters()
      // includes it) gets no gradient and no update, as LibTorch's own step
      // skips a parameter without a gradient.
      if (frozen.count(p.unsafeGetTensorImpl())) continue;
      auto it = seen.find(p.unsafeGetTensorImpl());
      TANDEM_CHECK_ARG(it != seen.end(),
                       "ZeroOptimizer: the optimizer holds a tensor of shape {} that is not a "
                       "parameter of the model it shards. Build the optimizer over this "
                       "model's parameters (model->parameters()), and prepare the optimizer "
                       "before any master weights replace them",
                       fmt::join(p.sizes(), "x"));
      param_group_of_[it->second] = g;
    }
  }
}

void ZeroLayout::build_bucket_groups() {
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
}

void ZeroLayout::build_unit_groups(torch::nn::Module& model, ProcessGroup& pg) {
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
  auto_wrap(model, options_.auto_wrap);
  const auto wrapped = auto_units(model);
  std::vector<ShardedUnit*> units;
  std::vector<std::string> unit_names;
  std::vector<std::size_t> unit_of(params_.size(), kNoGroup);
  for (const auto& item : model.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const auto& module = item.value();
    auto* unit = dynamic_cast<ShardedUnit*>(module.get());
    if (unit == nullptr) {
      auto it = wrapped.find(module.get());
      if (it == wrapped.end()) continue;
      unit = it->second;
    }
    TANDEM_CHECK_ARG(!unit->sharding_attached(),
                     "ZeroOptimizer: a Sharded unit of this model is already owned by another "
                     "ZeroOptimizer; one ZeRO optimizer per model");
    const std::vector<int> inside = registrations(*module);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (inside[i] > 0 && inside[i] == everywhere[i]) unit_of[i] = units.size();
    }
    units.push_back(unit);
    unit_names.push_back(item.key().empty() ? "(the model itself)" : item.key());
  }
  if (units.empty() && rank_ == 0) {
    log_warn("ZeRO stage 3 found no unit in the model (no tandem::Sharded block, no auto-wrap "
             "policy): every parameter stays whole on each rank, as in FSDP's root unit "
             "without a wrap policy, and only gradients and optimizer state are sharded. To "
             "shard the parameters too, declare blocks tandem::Sharded<BlockImpl> "
             "(tandem/zero/sharded.h) or set an auto-wrap policy (fsdp_auto_wrap_policy; "
             "tandem/zero/auto_wrap.h)");
  }
  // Launch order: units in reverse forward order, then the loose parameters.
  // Parameters under the persistence threshold stay whole, with the loose ones.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].numel() < options_.param_persistence_threshold) unit_of[i] = kNoGroup;
  }
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
  settle_construction_shards(units, unit_names, pg);
  refuse_memoryless_parameters();
}

void ZeroLayout::finish_group(FlatGroup& group, ProcessGroup& pg, ProcessGroup* replicate,
                              torch::optim::Optimizer& optimizer, UpdateRule rule) {
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
  torch::NoGradGuard no_grad;
  at::Tensor my_slice;
  const bool adopted = group.construction != nullptr;
  if (adopted) {
    // zero::Init cut the unit in this very layout: its parameters are views
    // of the released buffer and this rank's slice is kept. Nothing to copy
    // or broadcast (every rank built the same values: checked by fingerprint).
    TANDEM_CHECK(group.construction->full.numel() == group.padded &&
                     group.construction->shard_begin == group.shard_begin,
                 "ZeroOptimizer: internal error: a unit cut by zero::Init has another layout");
    group.full = group.construction->full;
    my_slice = group.construction->shard;
    group.construction.reset();
    // The fingerprints agree inside the shard group only; the copies of the
    // model in the other shard groups take this one's slices.
    if (replicate != nullptr) replicate->broadcast(my_slice, 0);
  } else {
    group.full = at::zeros({group.padded}, first.options().requires_grad(false));
    for (std::size_t k = 0; k < group.members.size(); ++k) {
      at::Tensor& p = params_[group.members[k]];
      at::Tensor view = internals::flat_alias(group.full, group.offsets[k], p.sizes());
      view.copy_(p);
      internals::rebind_parameter_data(p, view);
    }
    pg.broadcast(group.full, 0);  // every rank starts from rank 0's values
    if (replicate != nullptr) replicate->broadcast(group.full, 0);  // ... of one shard group
    my_slice = group.full.narrow(0, group.shard_begin, group.shard_numel);
  }
  const bool fp32_params = dtype == at::kFloat;
  if (group.partitioned_params) {
    group.param_shard = adopted ? my_slice : my_slice.clone();
    if (options_.offload_param) {
      group.param_shard = to_state_device(group.param_shard, options_.pin_param_memory);
    }
    group.master_is_param = fp32_params && group.param_shard.device() == state_device_;
    internals::release_storage(group.full);  // the UnitGatherer's until the first forward
  } else {
    group.master_is_param = fp32_params && !options_.offload_optimizer;
  }
  if (group.master_is_param) {
    group.master = group.partitioned_params ? group.param_shard : my_slice;
  } else {
    group.master = empty_state(group.shard_numel);
    group.master.copy_(group.partitioned_params ? group.param_shard : my_slice);
  }
  if (!plan_.shard_gradients) {  // FlatAllReduce: .grad views one whole buffer
    group.grad_full = at::zeros({group.padded}, first.options().requires_grad(false));
    group.grad_shard_is_view = fp32_params && !options_.offload_optimizer;
    group.grad_shard = group.grad_shard_is_view
                           ? group.grad_full.narrow(0, group.shard_begin, group.shard_numel)
                           : empty_state(group.shard_numel).zero_();
  } else {
    group.grad_shard = empty_state(group.shard_numel).zero_();
  }
  const auto states = state_names(rule, read_hyper(optimizer, rule)).size();
  for (std::size_t s = 0; s < states; ++s) group.state.push_back(empty_state(group.shard_numel).zero_());
  build_runs(group);
}

void ZeroLayout::build_runs(FlatGroup& group) {
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

at::Tensor ZeroLayout::empty_state(int64_t n) const {
  auto options = at::TensorOptions().dtype(at::kFloat).device(state_device_);
  // Host buffers that feed or receive device copies are pinned, so the
  // copies run asynchronously.
  const bool pin = state_device_.is_cpu() && device_.is_cuda() && options_.pin_memory;
  return at::empty({n}, options.pinned_memory(pin));
}

at::Tensor ZeroLayout::to_state_device(const at::Tensor& t) const {
  return to_state_device(t, options_.pin_memory);
}

at::Tensor ZeroLayout::to_state_device(const at::Tensor& t, bool pin) const {
  if (t.device() == state_device_) return t;
  at::Tensor out = at::empty(t.sizes(), t.options().device(state_device_).pinned_memory(
                                            state_device_.is_cpu() && device_.is_cuda() && pin));
  out.copy_(t);
  return out;
}

ZeroMemoryStats ZeroLayout::memory_stats() const {
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

std::vector<std::vector<std::string>> ZeroLayout::group_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& group : groups_) {
    out.emplace_back();
    for (std::size_t i : group.members) out.back().push_back(names_[i]);
  }
  return out;
}

}  // namespace tandem::detail
