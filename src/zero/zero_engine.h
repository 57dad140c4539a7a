#pragma once
// The machinery behind tandem::ZeroOptimizer, in four parts, each owning its
// data (and lock, if it needs one):
//   ZeroLayout       the parameters, their flat groups and buffers (fixed
//                    after construction)
//   UnitGatherer     stage 3's gather, release and prefetch of Sharded units
//   GradientReducer  the gradient hooks and the reduction of each group
//                    (by the ReductionPolicy the ShardingPlan calls for)
//   ShardState       the sharded update, gradient norm and checkpoint shards
// The engine builds them, owns the communication queue and clock they
// share, and forwards ZeroOptimizer's calls. The stage is read once, into
// the ShardingPlan the layout keeps (sharding_plan.h); the parts ask the plan,
// never the stage. Lock order, where two nest: reducer, then gatherer, then
// clock (the clock calls nothing).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tandem/zero/zero_optimizer.h"
#include "zero/comm_clock.h"
#include "zero/comm_queue.h"
#include "zero/gradient_reducer.h"
#include "zero/shard_state.h"
#include "zero/shard_update.h"
#include "zero/unit_gatherer.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class ZeroEngine {
 public:
  // `replicate` (HSDP; may be null): the group each gradient shard is
  // all-reduced across after the reduce-scatter over `pg`.
  ZeroEngine(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
             std::shared_ptr<ProcessGroup> pg, std::shared_ptr<ProcessGroup> replicate,
             ZeroOptions options);

  void step();
  void zero_grad() { reducer_.zero_grad(); }
  double grad_norm() { return state_.grad_norm(); }
  double clip_grad_norm(double max_norm) { return state_.clip_grad_norm(max_norm); }
  std::vector<at::Tensor> gradient_shards() { return state_.gradient_shards(); }
  void set_gradient_sync(bool enabled) { reducer_.set_gradient_sync(enabled); }
  bool gradient_sync() const { return reducer_.gradient_sync(); }
  void gather_all() { gatherer_.gather_all(); }
  void release_all() { gatherer_.release_all(); }
  // GatheredParameters(params, modifier_rank): the groups holding `params`.
  // UsageError for a tensor that is no parameter of the sharded model.
  void gather_parameters(const std::vector<at::Tensor>& params);
  void release_held(std::optional<int> modifier_rank);

  int stage() const { return options_.stage; }
  const ZeroOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return *pg_; }
  ProcessGroup* replicate_group() const { return replicate_.get(); }
  ZeroMemoryStats memory_stats() const;
  std::vector<std::vector<std::string>> group_names() const { return layout_.group_names(); }
  int64_t step_count() const { return state_.step_count(); }
  ZeroOptimizer::CommStats comm_stats() const { return clock_.stats(); }
  double communication_wait_seconds() const { return clock_.blocked_seconds(); }
  void reset_stats();

  // Checkpoints.
  std::vector<ZeroOptimizer::ShardFragment> shard_fragments() const {
    return state_.shard_fragments();
  }
  std::vector<std::string> state_names() const { return state_.state_names(); }
  void load_shards(const ZeroOptimizer::FragmentSource& source, int64_t step_count);
  void load_parameter_shards(const ZeroOptimizer::ShardFill& fill);
  torch::nn::Module& module() const { return *model_; }
  void for_each_whole_parameter(
      const std::function<void(const std::string&, const at::Tensor&)>& fn);

 private:
  // The replicate group when it has more than one rank (HSDP), else null.
  ProcessGroup* replicas() const;

  // Members are destroyed in reverse: the hooks go first (with the reducer
  // and the gatherer), then the queue, which waits for its tasks; those use
  // the layout, the clock and the process group, which go after it.
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<ProcessGroup> pg_;
  std::shared_ptr<ProcessGroup> replicate_;
  UpdateRule rule_;
  ZeroOptions options_;
  ZeroLayout layout_;  // keeps the ShardingPlan, built once from options_.stage
  CommClock clock_;
  CommQueue queue_;
  // Frozen parameters a GatheredParameters guard names (stage 3): whole on
  // every rank already, so the guard only keeps their values, to broadcast
  // the modifier rank's or put them back on exit, as it does for a unit.
  struct FrozenHold {
    std::vector<at::Tensor> params;
    std::vector<at::Tensor> kept;
  };
  std::vector<FrozenHold> frozen_holds_;
  UnitGatherer gatherer_;
  GradientReducer reducer_;
  ShardState state_;
};

}  // namespace tandem::detail
