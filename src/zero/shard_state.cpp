// The sharded update, the gradient norm over the shards, and checkpoint
// access to the shards by parameter and element range.

#include "zero/shard_state.h"

#include <cmath>
#include <exception>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

// The parameter values of `group` that this rank owns, as one shard-long
// tensor (views, never copies).
at::Tensor value_shard(const FlatGroup& group) {
  return group.partitioned_params ? group.param_shard
                                  : group.full.narrow(0, group.shard_begin, group.shard_numel);
}

}  // namespace

ShardState::ShardState(const ZeroLayout& layout, UnitGatherer& gatherer,
                       torch::optim::Optimizer& optimizer, UpdateRule rule, ProcessGroup& pg,
                       CommQueue& queue, const ZeroOptions& options)
    : layout_(layout),
      gatherer_(gatherer),
      optimizer_(optimizer),
      rule_(rule),
      pg_(pg),
      queue_(queue),
      options_(options),
      names_(detail::state_names(rule, read_hyper(optimizer, rule))) {
  if (rule_ == UpdateRule::kCustom) build_custom_optimizer(optimizer);
}

void ShardState::build_custom_optimizer(torch::optim::Optimizer& optimizer) {
  // One param group per group of the user's optimizer (some may hold no
  // tensor on this rank), each tensor a view of one run of a master shard.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& g : optimizer.param_groups()) {
    groups.emplace_back(std::vector<at::Tensor>{}, g.options().clone());
  }
  for (const auto& group : layout_.groups()) {
    for (const auto& run : group.runs) {
      at::Tensor master = group.master.narrow(0, run.shard_offset, run.length);
      groups.at(run.param_group).params().push_back(master);
      custom_grads_.emplace_back(master, group.grad_shard.narrow(0, run.shard_offset, run.length));
    }
  }
  custom_ = options_.shard_optimizer_factory(std::move(groups));
  TANDEM_CHECK_ARG(custom_ != nullptr &&
                       custom_->param_groups().size() == optimizer.param_groups().size(),
                   "ZeroOptions::shard_optimizer_factory must return an optimizer over the "
                   "param groups it is given ({} of them, as the optimizer passed to ZeRO); it "
                   "returned {}",
                   optimizer.param_groups().size(),
                   custom_ == nullptr ? std::string("none")
                                      : std::to_string(custom_->param_groups().size()) +
                                            " group(s)");
}

void ShardState::step() {
  ++step_;
  const std::vector<UpdateHyper> hyper = read_hyper(optimizer_, rule_);
  check_state_kept(rule_, hyper, names_);
  torch::NoGradGuard no_grad;
  if (rule_ == UpdateRule::kCustom) {
    update_custom();
  } else if (rule_ == UpdateRule::kLamb) {
    update_lamb(hyper);
  } else {
    update_elementwise(hyper);
  }
  for (const auto& group : layout_.groups()) {
    if (!group.master_is_param) {
      at::Tensor target = group.partitioned_params
                              ? group.param_shard
                              : group.full.narrow(0, group.shard_begin, group.shard_numel);
      target.copy_(group.master, /*non_blocking=*/true);
    }
    if (group.partitioned_params) continue;  // the next forward gathers
    at::Tensor full = group.full;
    at::Tensor shard = full.narrow(0, group.shard_begin, group.shard_numel).clone();
    gatherer_.all_gather_whole(full, shard);
  }
}

void ShardState::update_elementwise(const std::vector<UpdateHyper>& hyper) {
  for (const auto& group : layout_.groups()) {
    for (const auto& run : group.runs) {
      std::vector<at::Tensor> state;
      for (const auto& s : group.state) state.push_back(s.narrow(0, run.shard_offset, run.length));
      update_shard(rule_, hyper[run.param_group], step_,
                   group.master.narrow(0, run.shard_offset, run.length),
                   group.grad_shard.narrow(0, run.shard_offset, run.length), std::move(state),
                   options_.cpu_adam_threads);
    }
  }
}

void ShardState::update_lamb(const std::vector<UpdateHyper>& hyper) {
  struct Pending {
    at::Tensor master, direction;
    std::size_t param, param_group;
  };
  std::vector<Pending> pending;
  // [2 * param]: the sum of squares of its values, [2 * param + 1]: of its
  // direction, over this rank's segments, then (summed) over every rank's.
  std::vector<double> squares(2 * layout_.params().size(), 0.0);
  for (const auto& group : layout_.groups()) {
    for (const auto& seg : group.segments) {
      const std::size_t pg = layout_.param_group(seg.param);
      if (pg == ZeroLayout::kNotOptimized) continue;
      at::Tensor master = group.master.narrow(0, seg.shard_offset, seg.length);
      at::Tensor m = group.state[0].narrow(0, seg.shard_offset, seg.length);
      at::Tensor v = group.state[1].narrow(0, seg.shard_offset, seg.length);
      at::Tensor u = lamb_direction(master, group.grad_shard.narrow(0, seg.shard_offset, seg.length),
                                    m, v, hyper[pg].lamb, &squares[2 * seg.param],
                                    &squares[2 * seg.param + 1]);
      pending.push_back({master, std::move(u), seg.param, pg});
    }
  }
  at::Tensor total = at::tensor(squares, at::TensorOptions().dtype(at::kDouble));
  pg_.all_reduce(total, ReduceOp::kSum);
  const double* sums = total.data_ptr<double>();
  for (auto& p : pending) {
    p.master.add_(p.direction, -lamb_factor(hyper[p.param_group].lamb, step_, sums[2 * p.param],
                                            sums[2 * p.param + 1]));
  }
}

void ShardState::update_custom() {
  auto& user = optimizer_.param_groups();
  auto& mine = custom_->param_groups();
  for (std::size_t g = 0; g < user.size(); ++g) mine[g].set_options(user[g].options().clone());
  for (auto& [master, grad] : custom_grads_) master.mutable_grad() = grad;
  custom_->step();
}

double ShardState::grad_norm() {
  queue_.drain();
  double local = 0.0;
  for (const auto& group : layout_.groups()) {
    local += group.grad_shard.to(at::kDouble).pow(2).sum().item<double>();
  }
  at::Tensor total = at::full({1}, local, at::TensorOptions().dtype(at::kDouble));
  pg_.all_reduce(total, ReduceOp::kSum);
  return std::sqrt(total.item<double>());
}

double ShardState::clip_grad_norm(double max_norm) {
  TANDEM_CHECK_ARG(max_norm > 0, "clip_grad_norm: max_norm must be positive, got {}", max_norm);
  const double norm = grad_norm();
  // torch::nn::utils::clip_grad_norm_'s rule.
  const double coef = max_norm / (norm + 1e-6);
  // torch clamps the coefficient at 1: a NaN norm makes every gradient NaN
  // (the step is then visibly broken, or skipped by a loss scaler), never a
  // step with the gradients unclipped.
  if (!(coef >= 1.0)) {
    torch::NoGradGuard no_grad;
    for (const auto& group : layout_.groups()) group.grad_shard.mul_(coef);
  }
  return norm;
}

std::vector<at::Tensor> ShardState::gradient_shards() {
  queue_.drain();
  std::vector<at::Tensor> out;
  for (const auto& group : layout_.groups()) out.push_back(group.grad_shard);
  return out;
}

std::vector<std::string> ShardState::state_names() const {
  TANDEM_CHECK_ARG(rule_ != UpdateRule::kCustom,
                   "checkpoints of ZeRO with an optimizer built by shard_optimizer_factory are "
                   "not supported: tandem cannot read or write that optimizer's state, so a "
                   "resumed run would not continue this one. Save the weights alone "
                   "(save_model), or use an optimizer ZeRO shards itself (Adam, AdamW, SGD, "
                   "Adagrad, RMSprop, tandem::Lion, tandem::Lamb)");
  return names_;
}

std::vector<ZeroOptimizer::ShardFragment> ShardState::shard_fragments() const {
  std::vector<ZeroOptimizer::ShardFragment> out;
  for (const auto& group : layout_.groups()) {
    const at::Tensor values = value_shard(group);
    for (const auto& seg : group.segments) {
      ZeroOptimizer::ShardFragment f;
      f.name = layout_.name(seg.param);
      f.begin = seg.param_offset;
      f.value = values.narrow(0, seg.shard_offset, seg.length);
      if (!group.master_is_param) f.master = group.master.narrow(0, seg.shard_offset, seg.length);
      for (const auto& s : group.state) f.state.push_back(s.narrow(0, seg.shard_offset, seg.length));
      out.push_back(std::move(f));
    }
  }
  return out;
}

void ShardState::load_shards(const ZeroOptimizer::FragmentSource& source, int64_t step_count) {
  queue_.drain();
  const std::vector<std::string> states = state_names();
  torch::NoGradGuard no_grad;
  // A read that fails here (one rank's file) must not leave the other ranks
  // alone in reassemble()'s all-gathers: keep reassembling, rethrow after.
  std::exception_ptr failure;
  for (std::size_t g = 0; g < layout_.groups().size(); ++g) {
    const FlatGroup& group = layout_.groups()[g];
    at::Tensor values = value_shard(group);
    if (!failure) {
      try {
        load_group(group, values, source, states);
      } catch (...) {
        failure = std::current_exception();
      }
    }
    reassemble(g, values);
  }
  if (failure) std::rethrow_exception(failure);
  step_ = step_count;
}

void ShardState::load_group(const FlatGroup& group, const at::Tensor& values,
                            const ZeroOptimizer::FragmentSource& source,
                            const std::vector<std::string>& states) {
  for (const auto& seg : group.segments) {
    const std::string& name = layout_.name(seg.param);
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
}

void ShardState::load_parameter_shards(const ZeroOptimizer::ShardFill& fill) {
  queue_.drain();
  torch::NoGradGuard no_grad;
  for (std::size_t g = 0; g < layout_.groups().size(); ++g) {
    const FlatGroup& group = layout_.groups()[g];
    at::Tensor values = value_shard(group);
    for (const auto& seg : group.segments) {
      // Into the fp32 master when there is one, so an fp32 file keeps its
      // precision there; the parameter gets its rounding of it.
      at::Tensor value = values.narrow(0, seg.shard_offset, seg.length);
      at::Tensor target =
          group.master_is_param ? value : group.master.narrow(0, seg.shard_offset, seg.length);
      if (fill(layout_.name(seg.param), seg.param_offset, target) && !group.master_is_param) {
        value.copy_(target);
      }
    }
    reassemble(g, values);
  }
}

void ShardState::reassemble(std::size_t g, const at::Tensor& values) {
  const FlatGroup& group = layout_.groups()[g];
  if (!group.partitioned_params) {
    at::Tensor full = group.full;
    at::Tensor shard = values.clone();
    gatherer_.all_gather_whole(full, shard);
  } else {
    gatherer_.release(g);  // nothing if released already
  }
}

}  // namespace tandem::detail
