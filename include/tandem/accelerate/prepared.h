#pragma once
// The objects Accelerator::prepare() hands back: an optimizer, a scheduler
// and a data loader that the training loop keeps using as before, and that
// follow the Accelerator's micro-step (gradient accumulation) rules:
//
//   * the optimizer's step() and zero_grad() act only when the current
//     micro-step synchronises gradients (every gradient_accumulation_steps
//     micro-batches, and on the last batch of a pass);
//   * the scheduler steps once per real optimizer step: never once per
//     micro-batch and never once per rank (the Accelerate pitfall of
//     stepping it num_processes times);
//   * the loader yields this rank's shard and tells the Accelerator when it
//     hands out the last batch of a pass.
//
// Each object refers to the wrapped torch object (which must outlive it) and
// shares the Accelerator's GradientState. One training thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <map>
#include <string>

#include <torch/optim/optimizer.h>

#include "tandem/accelerate/gradient_state.h"
#include "tandem/amp/loss_scaler.h"
#include "tandem/amp/master_weights.h"
#include "tandem/config/config.h"
#include "tandem/data/distributed_loader.h"

namespace tandem {

class ZeroOptimizer;

class ProcessGroup;

// Gradient-norm clipping over every parameter the optimizer holds.
// Returns the total norm before clipping (as torch's clip_grad_norm_).
// `sharded_over`: non-null when each rank holds a different part of the
// gradients (ZeRO), so squared norms are summed across its ranks; null with
// DDP, whose gradients are identical on every rank.
double clip_gradients(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                      ProcessGroup* sharded_over);

namespace detail {

// What the prepared optimizer and the Accelerator share for one optimizer:
// the loss scaler, the fp32 master weights (when the model's parameters are
// bf16/fp16), and whether the current step's gradients are already
// unscaled. Used from the training thread only.
class OptimizerCore {
 public:
  // `group`: the ranks that must agree on skipping an overflowing step.
  // `zero`: the ZeRO optimizer that owns the update (nullptr: `optimizer`
  // steps itself); it keeps its own fp32 master shards.
  OptimizerCore(torch::optim::Optimizer& optimizer, std::shared_ptr<GradientState> state,
                std::shared_ptr<LossScaler> scaler, double gradient_clipping,
                ProcessGroup* group, ZeroOptimizer* zero = nullptr);

  // Unscales the current step's gradients once (into the fp32 masters when
  // there are any) and records whether any is inf/NaN. Later calls in the
  // same step do nothing.
  void unscale_gradients();
  void step();
  void zero_grad();

  torch::optim::Optimizer& optimizer() const { return *optimizer_; }
  const GradientState& state() const { return *state_; }
  bool has_master_weights() const { return master_ != nullptr; }
  // The fp32 masters of a bf16/fp16 model (nullptr otherwise).
  const MasterWeights* master_weights() const { return master_.get(); }
  double clip(double max_norm, double norm_type);

 private:
  void end_step();

  torch::optim::Optimizer* optimizer_;
  std::shared_ptr<GradientState> state_;
  std::shared_ptr<LossScaler> scaler_;
  std::unique_ptr<MasterWeights> master_;
  double gradient_clipping_;
  ProcessGroup* group_;
  ZeroOptimizer* zero_;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace detail

class AcceleratedOptimizer {
 public:
  explicit AcceleratedOptimizer(std::shared_ptr<detail::OptimizerCore> core);

  // Steps the wrapped optimizer when the current micro-step synchronises
  // gradients: unscales them (loss scaling), skips the step when any is
  // inf/NaN (the scaler then backs off), clips to the config's
  // gradient_clipping unless clip_grad_norm() already ran, steps, and copies
  // fp32 master weights back into a bf16/fp16 model. A no-op on micro-steps
  // that do not synchronise. step_was_skipped() tells either case.
  // Throws UsageError when accumulation is on and no micro-step was begun
  // with Accelerator::backward() or accumulate() since the last step, and
  // ScaleCollapseError when fp16 loss scaling cannot recover.
  void step();
  // Zeroes the gradients in place, unless backward() has added gradients
  // that no synchronising step() has consumed yet (they are being
  // accumulated). Keyed on what happened rather than on the current
  // micro-step, so it is right at the top or the bottom of the loop body,
  // inside or outside an accumulate() guard.
  void zero_grad();
  // True when the last step() changed nothing.
  bool step_was_skipped() const { return core_->state().last_step_skipped; }

  torch::optim::Optimizer& optimizer() const { return core_->optimizer(); }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() {
    return core_->optimizer().param_groups();
  }

 private:
  std::shared_ptr<detail::OptimizerCore> core_;
};

namespace detail {

// A prepared scheduler's state, shared with the Accelerator so that
// save_state()/load_state() can reach it however the loop holds the
// AcceleratedScheduler.
struct SchedulerCore {
  std::function<void()> step_fn;
  // tandem::LRScheduler's state_dict()/load_state_dict(); empty for LibTorch
  // schedulers, which load_state() restores by replaying step_fn.
  std::function<std::map<std::string, double>()> state_dict;
  std::function<void(const std::map<std::string, double>&)> load_state_dict;
  int64_t seen_optimizer_steps = 0;
  int64_t steps = 0;
};

}  // namespace detail

class AcceleratedScheduler {
 public:
  // `step_fn` advances the wrapped scheduler by one step.
  AcceleratedScheduler(std::function<void()> step_fn, std::shared_ptr<GradientState> state);
  AcceleratedScheduler(std::shared_ptr<detail::SchedulerCore> core,
                       std::shared_ptr<GradientState> state);

  // Advances the wrapped scheduler once if the optimizer really stepped since
  // the last call; a no-op otherwise. Call it right after optimizer.step().
  void step();
  // Wrapped-scheduler steps taken.
  int64_t steps() const { return core_->steps; }

 private:
  std::shared_ptr<detail::SchedulerCore> core_;
  std::shared_ptr<GradientState> state_;
};

namespace detail {

// Where a PreparedLoader is in its data: shared with the Accelerator, which
// saves it in checkpoints and restores it on load_state().
struct LoaderCursor {
  int64_t skip = 0;              // batches the next pass skips
  int64_t position = 0;          // batches handed out in the current pass
  bool in_pass = false;
  int64_t completed_passes = 0;  // the epoch an un-set next pass takes
  bool epoch_set = false;        // set_epoch() was called since the last pass
  int64_t epoch = 0;             // the loader's epoch, mirrored
  int64_t size = 0;              // batches per pass
  // load_state() rewrote the fields above: apply them to the loader before
  // the next batch.
  bool restore_pending = false;
};

}  // namespace detail

// A DistributedLoader that reports its position to the Accelerator.
// Iterate it exactly like DistributedLoader (range-for, or next()). Unlike
// DistributedLoader, the epoch advances by itself after each complete pass
// (as Accelerate's loaders do), so shuffling differs per epoch even when the
// loop never calls set_epoch(); an explicit set_epoch() wins.
//
// Join mode: a pass that starts while an Accelerator::join_uneven_inputs()
// guard lives is a joined pass. It never pads (even_batches is off for it),
// so each rank sees exactly its share; at its start the ranks exchange their
// batch counts (one all-gather), and every rank then yields as many batches
// as the longest one. A rank past its own data yields shadow batches (its
// last real batch again, GradientState::shadow_batch set) that contribute
// zero gradient. Every rank ends the pass at the same batch, so collectives
// stay matched.
class PreparedLoader {
 public:
  PreparedLoader(DistributedLoader loader, std::shared_ptr<GradientState> state);
  // `group`: the ranks a joined pass agrees with (needed for join mode only).
  PreparedLoader(DistributedLoader loader, std::shared_ptr<GradientState> state,
                 std::shared_ptr<detail::LoaderCursor> cursor, ProcessGroup* group = nullptr);

  int64_t size() const { return loader_.size(); }
  // Selects the epoch of the next pass (ends a pass in progress).
  void set_epoch(int64_t epoch);
  // The epoch of the pass in progress, or of the next one after
  // load_state() restored a position.
  int64_t epoch() const { return cursor_->epoch; }
  // Ends a pass in progress; the next batch starts a new one.
  void start_new_pass();
  void skip_first_batches(int64_t num_batches);
  std::optional<DistributedLoader::Batch> next();
  // Batches handed out in the current pass, skipped ones included.
  int64_t position() const { return cursor_->position; }

  DistributedLoader& loader() { return loader_; }
  const DistributedLoader& loader() const { return loader_; }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = DistributedLoader::Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = value_type*;
    using reference = value_type&;

    Iterator() = default;
    value_type& operator*() { return *batch_; }
    value_type* operator->() { return &*batch_; }
    Iterator& operator++();
    bool operator==(const Iterator& other) const { return !batch_ && !other.batch_; }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    friend class PreparedLoader;
    explicit Iterator(PreparedLoader* loader);
    PreparedLoader* loader_ = nullptr;
    uint64_t pass_id_ = 0;
    std::optional<value_type> batch_;
  };
  // Starts a new pass (ending one in progress), as DistributedLoader::begin().
  // Calling set_epoch() or skip_first_batches() inside the loop body makes
  // the next ++ throw UsageError instead of silently restarting.
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  // A joined pass (prepared_loader_join.cpp).
  struct JoinedPass {
    bool active = false;
    std::vector<int64_t> sizes;  // every rank's batch count this pass
    int64_t length = 0;          // batches every rank yields: the largest size
    std::optional<DistributedLoader::Batch> last_real;  // the shadow stand-in
  };

  void note_batch(const DistributedLoader::Batch& batch);
  void apply_restore();
  void set_loader_epoch(int64_t epoch);
  void end_of_pass();
  void begin_joined_pass();
  std::optional<DistributedLoader::Batch> next_joined();
  DistributedLoader::Batch stand_in_batch();
  void note_joined_batch(const DistributedLoader::Batch& batch, int64_t index);

  DistributedLoader loader_;
  std::shared_ptr<GradientState> state_;
  std::shared_ptr<detail::LoaderCursor> cursor_;
  ProcessGroup* group_ = nullptr;
  bool even_batches_ = true;  // the loader's own setting, outside joined passes
  JoinedPass joined_;
  uint64_t pass_id_ = 0;  // changes whenever a pass is ended from outside
};

}  // namespace tandem
