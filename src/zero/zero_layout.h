#pragma once
// The layout of a ZeroOptimizer's model: its trainable parameters, which
// FlatGroup each lies in (gradient buckets in stages 1 and 2, one group per
// Sharded unit plus the loose parameters in stage 3), this rank's shard of
// each group, and the buffers behind them (flat parameters, fp32 masters,
// gradient shards, optimizer state).
//
// Built once, by the constructor, on every rank together (it broadcasts and
// votes); its shape never changes after. The buffers' values do: each is
// written by the part of the engine that owns its use (the GradientReducer
// the gradients, the ShardState the masters, state and parameter shards,
// the UnitGatherer a stage-3 unit's `full` storage, which it frees and
// reallocates). That is why groups() hands out const groups whose tensors
// stay writable: an ATen handle's const does not reach its data.
//
// Thread-safety: read-only after construction, so any thread may read it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/process_group.h"
#include "tandem/zero/zero_optimizer.h"
#include "zero/flat_group.h"
#include "zero/shard_update.h"
#include "zero/sharding_plan.h"

namespace tandem {
class ShardedUnit;
}

namespace tandem::detail {

class ZeroLayout {
 public:
  // Lays `model` out for `pg`'s ranks as `plan` says (units or buckets, a
  // flat gradient buffer or not), rebinding its parameters to views of the
  // flat buffers, with every rank starting from rank 0's values (or
  // adopting the shards zero::Init cut); `rule` sizes the optimizer state.
  // With a `replicate` group (HSDP; may be null) each rank then takes its
  // counterpart's values in replicate rank 0's shard group, so that every
  // copy of the model starts equal.
  ZeroLayout(torch::nn::Module& model, torch::optim::Optimizer& optimizer, ProcessGroup& pg,
             ProcessGroup* replicate, const ZeroOptions& options, ShardingPlan plan,
             UpdateRule rule);
  ZeroLayout(const ZeroLayout&) = delete;
  ZeroLayout& operator=(const ZeroLayout&) = delete;

  // What the stage shards; the other parts ask it, never the stage.
  const ShardingPlan& plan() const { return plan_; }
  // The trainable parameters, tied ones once, in registration order.
  const std::vector<at::Tensor>& params() const { return params_; }
  // The frozen ones (requires_grad false), tied ones once: not sharded, whole
  // on every rank.
  const std::vector<at::Tensor>& frozen_params() const { return frozen_params_; }
  const std::string& name(std::size_t param) const { return names_[param]; }
  // The optimizer param group of `param`, or kNotOptimized.
  static constexpr std::size_t kNotOptimized = static_cast<std::size_t>(-1);
  std::size_t param_group(std::size_t param) const { return param_group_of_[param]; }
  // In launch order (the reverse of the order gradients are expected in).
  const std::vector<FlatGroup>& groups() const { return groups_; }
  // Each parameter's group, and its first element in the group's buffer.
  const std::vector<std::size_t>& group_of() const { return group_of_; }
  int64_t flat_offset(std::size_t param) const { return flat_offset_[param]; }
  // Where the parameters live (and the packed gradients are made).
  c10::Device device() const { return device_; }

  // The bytes the buffers hold now, and the gradients autograd holds outside
  // them; the gathered-parameter fields are the UnitGatherer's to fill.
  ZeroMemoryStats memory_stats() const;
  // `t` copied to where the optimizer state lives (pinned host memory when
  // it is offloaded from a GPU), or `t` itself when it is already there.
  at::Tensor to_state_device(const at::Tensor& t) const;
  // The same, pinned as `pin` says (offload_param's pin_memory).
  at::Tensor to_state_device(const at::Tensor& t, bool pin) const;
  std::vector<std::vector<std::string>> group_names() const;

 private:
  void collect_parameters(torch::nn::Module& model, torch::optim::Optimizer& optimizer);
  void build_bucket_groups();
  void build_unit_groups(torch::nn::Module& model, ProcessGroup& pg);
  void settle_construction_shards(const std::vector<ShardedUnit*>& units,
                                  const std::vector<std::string>& unit_names, ProcessGroup& pg);
  void refuse_memoryless_parameters() const;
  void finish_group(FlatGroup& group, ProcessGroup& pg, ProcessGroup* replicate,
                    torch::optim::Optimizer& optimizer, UpdateRule rule);
  void build_runs(FlatGroup& group);
  at::Tensor empty_state(int64_t n) const;

  const ZeroOptions& options_;
  const ShardingPlan plan_;
  int world_ = 1;
  int rank_ = 0;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::Device state_device_ = c10::Device(c10::kCPU);
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> frozen_params_;
  std::vector<std::string> names_;
  std::vector<std::size_t> param_group_of_;  // optimizer param group, or none
  std::vector<FlatGroup> groups_;
  std::vector<std::size_t> group_of_;
  std::vector<int64_t> flat_offset_;
};

}  // namespace tandem::detail
