#pragma once
// What each rank keeps of the optimizer between steps, and the sharded
// update (shard_update.h) on this rank's shard only, the step count, the
// gradient norm over every rank's shard, and checkpoint access to the shards
// by parameter and element range, so that a checkpoint written at one world
// size (or by DDP) loads at any other (see tandem/checkpoint/checkpoint.h).
//
// Thread-safety: none needed. The training thread calls it between
// backwards (the engine checks that none runs), and every call that reads
// the gradient shards first drains the queue, so neither the autograd hooks
// nor the communication thread touch the shards meanwhile.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/process_group.h"
#include "tandem/zero/zero_optimizer.h"
#include "zero/comm_queue.h"
#include "zero/shard_update.h"
#include "zero/unit_gatherer.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class ShardState {
 public:
  // `optimizer` is read at every step for its hyperparameters; it and the
  // other references outlive the state.
  ShardState(const ZeroLayout& layout, UnitGatherer& gatherer, torch::optim::Optimizer& optimizer,
             UpdateRule rule, ProcessGroup& pg, CommQueue& queue, const ZeroOptions& options);
  ShardState(const ShardState&) = delete;
  ShardState& operator=(const ShardState&) = delete;

  // Updates this rank's shards from the gradient shards (the queue drained),
  // then makes the whole parameters of stages 1 and 2 current; stage 3's
  // next forward gathers them.
  void step();
  int64_t step_count() const { return step_; }

  // The L2 norm of the gradient over every rank's shard (a collective).
  double grad_norm();
  // Scales the gradient shards so their norm is at most `max_norm`, as
  // torch::nn::utils::clip_grad_norm_; returns the norm before.
  double clip_grad_norm(double max_norm);
  std::vector<at::Tensor> gradient_shards();

  // The state kept per element; UsageError for an optimizer built by
  // shard_optimizer_factory, whose state tandem cannot name (checkpoints).
  std::vector<std::string> state_names() const;
  std::vector<ZeroOptimizer::ShardFragment> shard_fragments() const;
  // Loads (collectively) every shard from `source`, or the parameter values
  // only from `fill`; whole parameters are gathered again after. A failed
  // read still takes part in every all-gather, then throws (on that rank).
  void load_shards(const ZeroOptimizer::FragmentSource& source, int64_t step_count);
  void load_parameter_shards(const ZeroOptimizer::ShardFill& fill);

 private:
  // One group's values, masters and optimizer state from `source`.
  void load_group(const FlatGroup& group, const at::Tensor& values,
                  const ZeroOptimizer::FragmentSource& source,
                  const std::vector<std::string>& states);
  // After a load: whole parameters all-gathered again, stage-3 units released.
  void reassemble(std::size_t group, const at::Tensor& values);
  void update_elementwise(const std::vector<UpdateHyper>& hyper);
  // Lamb: the moments and directions of every segment, one all-reduce of
  // each parameter's sums of squares, then the update.
  void update_lamb(const std::vector<UpdateHyper>& hyper);
  void build_custom_optimizer(torch::optim::Optimizer& optimizer);
  void update_custom();

  const ZeroLayout& layout_;
  UnitGatherer& gatherer_;
  torch::optim::Optimizer& optimizer_;
  const UpdateRule rule_;
  ProcessGroup& pg_;
  CommQueue& queue_;
  const ZeroOptions& options_;
  std::vector<std::string> names_;  // state_names() at construction
  // shard_optimizer_factory's optimizer over views of the master shards
  // (one per ShardRun), and the gradient shard view of each.
  std::unique_ptr<torch::optim::Optimizer> custom_;
  std::vector<std::pair<at::Tensor, at::Tensor>> custom_grads_;
  int64_t step_ = 0;
};

}  // namespace tandem::detail
