#pragma once
// The machinery behind tandem::ZeroOptimizer: the flat groups, the autograd
// hooks that pack and reduce gradients as each group completes, the stage-3
// gather/release around each Sharded unit, and the sharded update.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/autograd/function.h>

#include "core/torch_internals.h"
#include "parallel/grad_readiness.h"
#include "tandem/zero/sharded.h"
#include "zero/sharded_hooks.h"
#include "tandem/zero/zero_optimizer.h"
#include "zero/comm_queue.h"
#include "zero/flat_group.h"
#include "zero/shard_update.h"

namespace tandem::detail {

class ZeroEngine {
 public:
  ZeroEngine(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
             std::shared_ptr<ProcessGroup> pg, ZeroOptions options);
  ~ZeroEngine();

  void step();
  void zero_grad();
  double grad_norm();
  double clip_grad_norm(double max_norm);
  std::vector<at::Tensor> gradient_shards();
  void set_gradient_sync(bool enabled);
  bool gradient_sync() const;
  void gather_all();
  void release_all();

  int stage() const { return options_.stage; }
  const ZeroOptions& options() const { return options_; }
  ProcessGroup& process_group() const { return *pg_; }
  ZeroMemoryStats memory_stats() const;
  std::vector<std::vector<std::string>> group_names() const;
  int64_t step_count() const { return step_; }
  ZeroOptimizer::CommStats comm_stats() const;
  void reset_stats();

  // Checkpoints (zero_state.cpp).
  std::vector<ZeroOptimizer::ShardFragment> shard_fragments() const;
  std::vector<std::string> state_names() const;
  void load_shards(const ZeroOptimizer::FragmentSource& source, int64_t step_count);
  void load_parameter_shards(const ZeroOptimizer::ShardFill& fill);
  torch::nn::Module& module() const { return *model_; }
  void for_each_whole_parameter(
      const std::function<void(const std::string&, const at::Tensor&)>& fn);

  // Autograd and unit hooks.
  void on_grad_ready(std::size_t index);
  void unit_before_forward(std::size_t group);
  at::Tensor unit_after_forward(std::size_t group, at::Tensor output);
  void unit_before_backward(std::size_t group);

 private:
  void collect_parameters(torch::nn::Module& model);
  void build_bucket_groups();
  void build_unit_groups(torch::nn::Module& model);
  void settle_construction_shards(const std::vector<ShardedUnit*>& units,
                                  const std::vector<std::string>& unit_names);
  void refuse_memoryless_parameters() const;
  void finish_group(FlatGroup& group);
  void build_runs(FlatGroup& group);
  void install_hooks();
  void install_unit_hooks();

  void finalize_backward();
  void adopt_grad(std::size_t index);
  void prepare(FlatGroup& group);
  void launch_ready_groups();
  void launch(FlatGroup& group);
  void wait_quiet();

  // After a load: whole parameters all-gathered again, stage-3 units released.
  void reassemble(FlatGroup& group, const at::Tensor& values);

  // Stage 3.
  void gather(FlatGroup& group, bool wait);
  // Starts gathers of the units after `index` in forward order (direction
  // +1) or before it (-1), within prefetch_bucket_size and
  // max_live_parameters.
  void prefetch_from(std::size_t index, int direction);
  void release(FlatGroup& group);
  void write_back_shard(FlatGroup& group);

  // Stats: the comm thread adds a collective's seconds to `field`.
  void count_comm(double ZeroOptimizer::CommStats::*field,
                  std::chrono::steady_clock::time_point start);
  void drain_timed();

  at::Tensor to_state_device(const at::Tensor& t) const;
  at::Tensor empty_state(int64_t n) const;

  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<ProcessGroup> pg_;
  ZeroOptions options_;
  UpdateRule rule_;
  int world_ = 1;
  int rank_ = 0;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::Device state_device_ = c10::Device(c10::kCPU);

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::size_t> param_group_of_;  // optimizer param group, or npos
  std::vector<FlatGroup> groups_;
  std::vector<std::size_t> group_of_;
  std::vector<int64_t> flat_offset_;  // each parameter's first element in its group
  std::vector<std::unique_ptr<ShardedUnitHooks>> unit_hooks_;
  std::vector<internals::GradHook> grad_hooks_;  // removed when the engine goes

  CommQueue queue_;
  std::mutex mutex_;  // the training thread and autograd hooks (never held across a call back in)
  bool sync_enabled_ = true;
  GradReadiness readiness_;  // which gradients of this backward arrived
  std::vector<std::size_t> forward_order_;
  bool forward_order_fixed_ = false;
  bool hold_gathered_ = false;
  int64_t step_ = 0;

  // Stage 3 accounting: bytes of unit parameters gathered now and at most.
  int64_t live_bytes_ = 0;
  int64_t peak_live_bytes_ = 0;
  mutable std::mutex stats_mutex_;  // comm_ is written on the comm thread
  ZeroOptimizer::CommStats comm_;
};

}  // namespace tandem::detail
