#pragma once
// The objects Accelerator::prepare() hands back, each as a std::shared_ptr
// that shares ownership of what it wraps and of the Accelerator's micro-step
// state: no object needs to outlive another. They follow the Accelerator's
// micro-step (gradient accumulation) rules:
//
//   * the optimizer's step() and zero_grad() act only when the current
//     micro-step synchronises gradients (every gradient_accumulation_steps
//     micro-batches, and on the last batch of a pass);
//   * the scheduler steps only after a real optimizer step (never on an
//     accumulating micro-batch or a skipped step), and then num_processes
//     times (once with split_batches), as Accelerate's AcceleratedScheduler;
//   * the loader yields this rank's shard and tells the Accelerator when it
//     hands out the last batch of a pass.
//
// Not thread-safe: one training thread, as for the loop itself.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include "tandem/data/distributed_loader.h"

namespace tandem {

class Accelerator;
class ProcessGroup;

namespace detail {
class OptimizerCore;
struct PreparedAccess;
class StepController;
struct LoaderCursor;
struct SchedulerCore;
}  // namespace detail

// Gradient-norm clipping over every parameter the optimizer holds.
// Returns the total norm before clipping (as torch's clip_grad_norm_).
// `sharded_over`: non-null when each rank holds a different part of the
// gradients (ZeRO), so squared norms are summed across its ranks; null with
// DDP, whose gradients are identical on every rank.
double clip_gradients(torch::optim::Optimizer& optimizer, double max_norm, double norm_type,
                      ProcessGroup* sharded_over);

// The prepared optimizer: a torch::optim::Optimizer, so it goes wherever one
// is expected (LibTorch and tandem schedulers, torch::save, your own code).
// Preparing moves the parameter groups and the state of the optimizer you
// passed into this object, which owns that optimizer from then on and runs
// its update rule:
//
//   * param_groups() and state() are the live ones: change the learning
//     rate here, or through a scheduler built over either object (learning
//     rates set on the optimizer you passed are carried over at the next
//     step(), and by a prepared scheduler's step()). Read them here too:
//     what a scheduler or load_state() writes lands here, and the optimizer
//     you passed shows it only after the next step();
//   * the optimizer you passed keeps no parameters. Calling its step() or
//     zero_grad() changes nothing, and the next step(), zero_grad() or
//     Accelerator::backward() throws UsageError saying so, instead of
//     training silently without accumulation or loss scaling.
//
// Through a torch::optim::Optimizer&: step() is virtual and does all of the
// above. LibTorch's zero_grad() is not virtual, so through that reference it
// clears every gradient at once, ignoring accumulation: at an accumulation
// boundary that is harmless, and in the middle of accumulation the next
// Accelerator::backward(), step() or zero_grad() throws UsageError saying the
// accumulated gradients were lost, instead of training on a partial sum.
// Call zero_grad() on this type (the shared_ptr prepare() returns).
class AcceleratedOptimizer final : public torch::optim::Optimizer {
 public:
  ~AcceleratedOptimizer() override;

  // Steps the wrapped optimizer when the current micro-step synchronises
  // gradients: unscales them (loss scaling), skips the step when any is
  // inf/NaN (the scaler then backs off), clips to the config's
  // gradient_clipping unless clip_grad_norm() already ran, steps, and copies
  // fp32 master weights back into a bf16/fp16 model. A no-op on micro-steps
  // that do not synchronise (returns an undefined tensor). step_was_skipped()
  // tells either case. `closure` is passed to the wrapped optimizer (not
  // under ZeRO, which refuses one).
  // Throws UsageError when accumulation is on and no micro-step was begun
  // with Accelerator::backward() or accumulate() since the last step, and
  // ScaleCollapseError when fp16 loss scaling cannot recover.
  at::Tensor step(LossClosure closure = nullptr) override;
  // Zeroes the gradients in place, unless backward() has added gradients
  // that no synchronising step() has consumed yet (they are being
  // accumulated). Keyed on what happened rather than on the current
  // micro-step, so it is right at the top or the bottom of the loop body,
  // inside or outside an accumulate() guard. Called again after another
  // synchronising backward (a GAN's generator loss reaching the
  // discriminator), it zeroes again, as torch's does. In place (DDP's
  // gradients are views of its buckets), so it takes no set_to_none.
  void zero_grad();
  // True when the last step() changed nothing: an fp16 overflow, or a
  // micro-step that only accumulates. (Accelerate's step_was_skipped is the
  // overflow alone: Accelerator::optimizer_step_was_skipped().)
  bool step_was_skipped() const;

  // LibTorch serialisation of the wrapped optimizer (torch::save/load).
  // tandem checkpoints (Accelerator::save_state) do not use it.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  friend class Accelerator;
  friend class AcceleratedScheduler;
  friend struct detail::SchedulerCore;
  friend struct detail::PreparedAccess;
  AcceleratedOptimizer(std::shared_ptr<torch::optim::Optimizer> wrapped,
                       std::unique_ptr<detail::OptimizerCore> core);

  std::unique_ptr<detail::OptimizerCore> core_;
};

// The prepared scheduler: owns the wrapped one (and the prepared optimizer
// it reads), and steps it as Accelerate's AcceleratedScheduler does.
class AcceleratedScheduler {
 public:
  ~AcceleratedScheduler();
  // If the optimizer really stepped since the last call, advances the
  // wrapped scheduler num_processes times (once with split_batches); a no-op
  // otherwise. With step_scheduler_with_optimizer off: once, always. Call it
  // right after optimizer->step().
  void step();
  // Wrapped-scheduler steps taken.
  int64_t steps() const;

 private:
  friend class Accelerator;
  friend struct detail::PreparedAccess;
  explicit AcceleratedScheduler(std::shared_ptr<detail::SchedulerCore> core);

  std::shared_ptr<detail::SchedulerCore> core_;
};

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
//
// Built by Accelerator::prepare_data_loader() and prepare_local_loader().
class PreparedLoader {
 public:
  ~PreparedLoader();
  PreparedLoader(const PreparedLoader&) = delete;
  PreparedLoader& operator=(const PreparedLoader&) = delete;

  int64_t size() const { return loader_.size(); }
  // Selects the epoch of the next pass (ends a pass in progress).
  void set_epoch(int64_t epoch);
  // The epoch of the pass in progress, or of the next one after
  // load_state() restored a position.
  int64_t epoch() const;
  // Ends a pass in progress; the next batch starts a new one.
  void start_new_pass();
  void skip_first_batches(int64_t num_batches);
  std::optional<DistributedLoader::Batch> next();
  // Batches handed out in the current pass, skipped ones included.
  int64_t position() const;

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
  friend class Accelerator;
  friend struct detail::PreparedAccess;
  // `group`: the ranks a joined pass agrees with.
  PreparedLoader(DistributedLoader loader, std::shared_ptr<detail::StepController> controller,
                 std::shared_ptr<detail::LoaderCursor> cursor,
                 std::shared_ptr<ProcessGroup> group);

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
  std::shared_ptr<detail::StepController> controller_;
  std::shared_ptr<detail::LoaderCursor> cursor_;
  std::shared_ptr<ProcessGroup> group_;
  bool even_batches_ = true;  // the loader's own setting, outside joined passes
  JoinedPass joined_;
  uint64_t pass_id_ = 0;  // changes whenever a pass is ended from outside
};

}  // namespace tandem
