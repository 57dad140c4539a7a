// The engine's own part: checking the options, building the parts in order,
// and the calls that span two of them.

#include "zero/zero_engine.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

// `options`, once they (and the model and group) are known to be usable:
// before anything is laid out.
ZeroOptions checked_options(const std::shared_ptr<torch::nn::Module>& model,
                            const std::shared_ptr<ProcessGroup>& pg,
                            const std::shared_ptr<ProcessGroup>& replicate,
                            const ZeroOptions& options) {
  TANDEM_CHECK_ARG(model != nullptr && pg != nullptr, "ZeroOptimizer: model and process group "
                   "must not be null");
  TANDEM_CHECK_ARG(replicate == nullptr || replicate->is_member(),
                   "ZeroOptimizer: [rank {}/{}] the replicate group does not hold this rank; "
                   "pass the group of this rank's counterparts in the other shard groups "
                   "(ProcessMesh::group(\"host\"))",
                   pg->rank(), pg->world_size());
  TANDEM_CHECK_ARG(replicate == nullptr || replicate->world_size() == 1 || options.stage >= 2,
                   "ZeroOptimizer: hybrid sharding (a replicate group of {} ranks) needs stage 2 "
                   "or 3, got stage {}: stage 1 all-reduces whole gradients, so replicating "
                   "across groups saves nothing. Set the stage to 2 (gradients and optimizer "
                   "state sharded in the group) or 3 (parameters too)",
                   replicate == nullptr ? 0 : replicate->world_size(), options.stage);
  TANDEM_CHECK_ARG(options.stage >= 1 && options.stage <= 3,
                   "ZeroOptimizer: stage must be 1, 2 or 3, got {} (stage 0 is plain DDP: use "
                   "tandem::DistributedDataParallel)",
                   options.stage);
  TANDEM_CHECK_ARG(!options.offload_param || options.stage == 3,
                   "ZeroOptimizer: offload_param needs stage 3 (parameters are partitioned only "
                   "there), got stage {}; set stage to 3 or offload_param to false",
                   options.stage);
  TANDEM_CHECK_ARG(options.allgather_bucket_size >= 1,
                   "ZeroOptions::allgather_bucket_size must be at least 1 element, got {}",
                   options.allgather_bucket_size);
  TANDEM_CHECK_ARG(options.reduce_bucket_size >= 0,
                   "ZeroOptimizer: reduce_bucket_size must be >= 0, got {}",
                   options.reduce_bucket_size);
  TANDEM_CHECK_ARG(options.prefetch_bucket_size >= 0 && options.max_live_parameters >= 1 &&
                       options.param_persistence_threshold >= 0,
                   "ZeroOptimizer: prefetch_bucket_size ({}) and param_persistence_threshold "
                   "({}) must be >= 0 and max_live_parameters ({}) >= 1",
                   options.prefetch_bucket_size, options.param_persistence_threshold,
                   options.max_live_parameters);
  return options;
}

}  // namespace

ZeroEngine::ZeroEngine(std::shared_ptr<torch::nn::Module> model,
                       torch::optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> pg,
                       std::shared_ptr<ProcessGroup> replicate, ZeroOptions options)
    : model_(std::move(model)),
      pg_(std::move(pg)),
      replicate_(std::move(replicate)),
      rule_(update_rule_of(optimizer, static_cast<bool>(options.shard_optimizer_factory))),
      options_(checked_options(model_, pg_, replicate_, options)),
      // The one place the stage chooses behaviour: the parts ask the plan.
      layout_(*model_, optimizer, *pg_, replicas(), options_, plan_for_stage(options_.stage),
              rule_),
      queue_(pg_.get()),
      gatherer_(layout_, *pg_, queue_, clock_, options_),
      reducer_(layout_, gatherer_, *pg_, replicas(), queue_, clock_, options_),
      state_(layout_, gatherer_, optimizer, rule_, *pg_, queue_, options_) {
  log_debug("ZeRO stage {}: {} parameter(s) in {} group(s) over {} rank(s), {} replica(s)",
            options_.stage, layout_.params().size(), layout_.groups().size(), pg_->world_size(),
            replicate_ == nullptr ? 1 : replicate_->world_size());
}

ProcessGroup* ZeroEngine::replicas() const {
  return replicate_ != nullptr && replicate_->world_size() > 1 ? replicate_.get() : nullptr;
}

void ZeroEngine::step() {
  TANDEM_CHECK(!reducer_.in_backward(), "ZeroOptimizer::step() called during backward");
  clock_.drain(queue_);
  clock_.end_step();
  gatherer_.settle_forward_order();
  state_.step();
}

ZeroMemoryStats ZeroEngine::memory_stats() const {
  ZeroMemoryStats stats = layout_.memory_stats();
  stats.gathered_parameter_bytes = gatherer_.live_bytes();
  stats.peak_gathered_parameter_bytes = gatherer_.peak_live_bytes();
  return stats;
}

void ZeroEngine::reset_stats() {
  gatherer_.reset_peak();
  clock_.reset();
}

void ZeroEngine::load_shards(const ZeroOptimizer::FragmentSource& source, int64_t step_count) {
  TANDEM_CHECK(!reducer_.in_backward() && !gatherer_.holding(),
               "ZeroOptimizer::load_shards() must run between steps, outside "
               "GatheredParameters");
  state_.load_shards(source, step_count);
}

void ZeroEngine::load_parameter_shards(const ZeroOptimizer::ShardFill& fill) {
  TANDEM_CHECK(!reducer_.in_backward() && !gatherer_.holding(),
               "ZeroOptimizer::load_parameter_shards() must run between steps, outside "
               "GatheredParameters");
  state_.load_parameter_shards(fill);
}

void ZeroEngine::for_each_whole_parameter(
    const std::function<void(const std::string&, const at::Tensor&)>& fn) {
  TANDEM_CHECK(!reducer_.in_backward(),
               "ZeroOptimizer::for_each_whole_parameter() called during backward");
  gatherer_.for_each_whole_parameter(fn);
}

void ZeroEngine::gather_parameters(const std::vector<at::Tensor>& params) {
  std::vector<std::size_t> groups;
  FrozenHold frozen;
  for (const at::Tensor& p : params) {
    auto same = [&p](const at::Tensor& q) {
      return q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    };
    const auto& trainable = layout_.params();
    const auto found = std::find_if(trainable.begin(), trainable.end(), same);
    if (found == trainable.end()) {
      const auto& frozen_params = layout_.frozen_params();
      TANDEM_CHECK_ARG(
          std::find_if(frozen_params.begin(), frozen_params.end(), same) != frozen_params.end(),
          "ZeroOptimizer::GatheredParameters: a tensor of shape {} is not a parameter of the "
          "model this optimizer shards; pass the model's own parameters (model->parameters())",
          p.defined() ? c10::str(p.sizes()) : std::string("undefined"));
      if (std::none_of(frozen.params.begin(), frozen.params.end(), same)) {
        frozen.params.push_back(p);
      }
      continue;
    }
    const std::size_t g = layout_.group_of()[static_cast<std::size_t>(found - trainable.begin())];
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  std::sort(groups.begin(), groups.end());
  if (layout_.plan().partition_parameters) {
    for (const at::Tensor& p : frozen.params) frozen.kept.push_back(p.detach().clone());
  } else {
    frozen.params.clear();  // stages 1 and 2 shard no parameter: nothing to do, as for units
  }
  gatherer_.gather_groups(groups);
  frozen_holds_.push_back(std::move(frozen));
}

void ZeroEngine::release_held(std::optional<int> modifier_rank) {
  gatherer_.release_held(modifier_rank);
  if (frozen_holds_.empty()) return;
  const FrozenHold hold = std::move(frozen_holds_.back());  // guards are scoped
  frozen_holds_.pop_back();
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < hold.params.size(); ++i) {
    at::Tensor p = hold.params[i];
    if (!modifier_rank) {
      p.copy_(hold.kept[i]);  // discarded, as a unit's changes are
      continue;
    }
    at::Tensor whole = p.is_contiguous() ? p : p.contiguous();
    pg_->broadcast(whole, *modifier_rank);
    if (!whole.is_same(p)) p.copy_(whole);
  }
}

}  // namespace tandem::detail
