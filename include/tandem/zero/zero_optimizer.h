#pragma once
// ZeroOptimizer: ZeRO stages 1, 2 and 3 (DeepSpeed's zero_optimization) for a
// LibTorch model and a torch::optim Adam, AdamW, SGD, Adagrad or RMSprop, a
// tandem::Lion or Lamb, or (ZeroOptions::shard_optimizer_factory) any
// elementwise optimizer.
//
//   torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   tandem::ZeroOptions options;
//   options.stage = 2;
//   tandem::ZeroOptimizer zero(model, adamw, pg, options);   // collective
//   for (...) {
//     zero.zero_grad();
//     loss_fn(model->forward(x), y).backward();   // gradients reduce-scattered
//     zero.clip_grad_norm(1.0);                   // optional, sharding-aware
//     zero.step();                                // shard update + all-gather
//   }
//
// What each rank keeps (Ψ parameters, N ranks, fp32 Adam):
//   stage 1  whole parameters and gradients, 1/N of the optimizer state:
//            gradients are averaged by bucketed all-reduce during backward
//            (as in DDP); each rank updates its shard of every bucket and the
//            updated shards are all-gathered.                 4Ψ + 4Ψ + 8Ψ/N
//   stage 2  whole parameters, 1/N of gradients and state: each bucket of
//            `reduce_bucket_size` elements is reduce-scattered as soon as its
//            gradients are complete (overlapping the rest of backward), and
//            its full gradients are freed.                       4Ψ + 12Ψ/N
//   stage 3  1/N of everything: tandem::Sharded units (or those an
//            auto-wrap policy picks, auto_wrap.h) are gathered before their
//            forward and backward and freed after (see sharded.h). 16Ψ/N
//
// Parameters are flattened into one buffer per bucket (stage 1/2) or per unit
// (stage 3), padded to a multiple of N; rank r owns slice r of each. The
// torch::optim optimizer supplies the hyperparameters, read at every step, so
// LR schedulers attached to it keep working; its own step() and state are
// never used. Each rank's update runs in tandem's fused CPU Adam on CPU fp32
// shards and in tensor ops elsewhere. Lamb's trust ratio needs each whole
// parameter's norms: each rank sums squares over its shard of it and one
// all-reduce per step completes them (DeepSpeed refuses Lamb under ZeRO).
//
// Mixed precision: bf16/fp16 parameters get fp32 master shards; gradients
// are reduced and accumulated in fp32. Loss scaling is the caller's
// (Accelerator): unscale the grad shards, agree on overflow, skip the step.
// offload_optimizer keeps master shards, gradient shards and optimizer state
// in host memory (pinned, with asynchronous copies, when the model is on
// CUDA); offload_param (stage 3) keeps the parameter shards there as well.
//
// Gradient accumulation: stage 1 honours set_gradient_sync(false) like DDP;
// stages 2 and 3 reduce-scatter every micro-step and accumulate into the
// shard (full gradients are never kept), so the switch has no effect there.
//
// HSDP (hybrid sharding: DeepSpeed ZeRO++'s hpZ partition, FSDP's
// HYBRID_SHARD): the constructor that takes a replicate group shards
// everything as above over the (small, fast) shard group only, and keeps one
// copy of the model per shard group. Each backward reduce-scatters the
// gradients inside the shard group, then all-reduces each rank's gradient
// shard once across its replicate group (its counterparts in the other shard
// groups), averaging over both; parameters are gathered inside the shard
// group only. So the only traffic across shard groups (hosts, typically) is
// that one all-reduce of each rank's gradient shard per micro-step. Stages 2
// and 3 (stage 1 is refused: it all-reduces whole gradients anyway).
//
// Contract: construct on every rank in the same order with the same model;
// one training thread; the model, the optimizer and the process group must
// outlive the ZeroOptimizer. While a backward or a stage-3 forward runs, the
// optimizer's collectives are in flight on a helper thread: issue no other
// collective on the same process group until backward() returns.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include "tandem/comm/process_group.h"
#include "tandem/zero/auto_wrap.h"

namespace tandem {

struct ZeroOptions {
  int stage = 2;  // 1, 2 or 3
  // Elements per gradient bucket (stages 1 and 2), DeepSpeed's
  // reduce_bucket_size. Stage 3 reduces one unit at a time.
  int64_t reduce_bucket_size = 500'000'000;
  // Stage 3 limits, DeepSpeed's stage3_* keys, in elements:
  // - prefetch_bucket_size: while a unit computes, gather the units after it
  //   (in forward order; in backward, the ones before it) as long as their
  //   elements add up to at most this; 0 turns prefetching off.
  // - max_live_parameters: gathered elements alive at once; a prefetch that
  //   would pass it waits. The unit needed now is gathered even when it
  //   alone is larger.
  // - param_persistence_threshold: parameters of fewer elements are not
  //   partitioned: they stay whole on every rank, like parameters outside
  //   every unit (their gradients and optimizer state are still sharded),
  //   and cost no gather. 0 partitions everything.
  int64_t prefetch_bucket_size = 50'000'000;
  int64_t max_live_parameters = 1'000'000'000;
  int64_t param_persistence_threshold = 0;
  bool offload_optimizer = false;  // master weights + optimizer state on the host
  bool offload_param = false;      // stage 3: parameter shards on the host
  bool pin_memory = true;          // host buffers pinned when the model is on CUDA
  bool pin_param_memory = true;    // the same for offload_param's parameter shards
  // Threads for the CPU Adam update; 0: LibTorch's intra-op thread count.
  int cpu_adam_threads = 0;
  // DeepSpeed's allgather_bucket_size, in elements: the all-gather that
  // makes a flat group's parameters whole (stages 1 and 2 after step(), a
  // stage-3 unit before use) is split into calls of at most this many
  // elements in all (at least one element per rank per call). Smaller
  // calls need a smaller staging buffer; the result is the same.
  int64_t allgather_bucket_size = 500'000'000;
  // DeepSpeed's reduce_scatter. False (stages 2 and 3): each gradient pack
  // is all-reduced whole and every rank keeps its own slice of the result,
  // which moves about twice the data for the same values. Stage 1 always
  // all-reduces.
  bool reduce_scatter = true;
  // DeepSpeed's overlap_comm. True: a group's gradients are reduced on the
  // communication thread as soon as they are complete, while backward goes
  // on. False: nothing is reduced until backward ends; then every group is
  // reduced, in order, before backward returns.
  bool overlap_comm = true;
  // An optimizer ZeRO does not shard itself (DeepSpeed's
  // zero_allow_untested_optimizer): when set, ZeRO calls it once, at
  // construction, with one param group per group of the optimizer passed to
  // it (same options, cloned) whose tensors are 1-D fp32 views of this
  // rank's master shards, and steps what it returns on them: each step
  // copies the passed optimizer's current options into it (schedulers keep
  // working) and sets each view's grad to its gradient shard. Right only for
  // optimizers that update each element from its own gradient and state
  // (Adam-like; not Adafactor, Shampoo, Muon or LBFGS, which need whole
  // rows or matrices; LBFGS is refused), as the shards cut parameters
  // anywhere. Such an optimizer's
  // state cannot be checkpointed (save_state refuses). Takes precedence over
  // the built-in rule of a known optimizer (e.g. Adam with amsgrad).
  using ShardOptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup>)>;
  ShardOptimizerFactory shard_optimizer_factory;
  // Stage 3: units chosen by a policy besides the tandem::Sharded ones
  // (FSDP's auto_wrap_policy; tandem/zero/auto_wrap.h), applied by the
  // constructor. With no unit at all, stage 3 keeps the parameters whole on
  // every rank (FSDP's root unit) and shards gradients and optimizer state.
  AutoWrapOptions auto_wrap;
};

// Bytes each rank holds now, by kind (the memory accounting of ZeRO's paper).
struct ZeroMemoryStats {
  int64_t parameter_bytes = 0;        // model parameters, whole or sharded
  int64_t gradient_bytes = 0;         // full gradients or gradient shards
  int64_t optimizer_state_bytes = 0;  // moments and fp32 master shards
  int64_t host_bytes = 0;             // the part of the above kept on the host when offloading
  // Stage 3: bytes of unit parameters gathered (whole) now, and the most
  // held at once since the optimizer was built or the peak was reset.
  int64_t gathered_parameter_bytes = 0;
  int64_t peak_gathered_parameter_bytes = 0;
  int64_t model_state_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_state_bytes;
  }
};

namespace detail {
class ZeroEngine;
}

class ZeroOptimizer {
 public:
  // Flattens and partitions `model`'s trainable parameters, broadcasting
  // rank 0's values first. `optimizer` must be over (a subset of) those
  // parameters and one of those named at the top, or options must carry a
  // shard_optimizer_factory (UsageError otherwise, as for amsgrad without
  // one, or LBFGS). Collective.
  ZeroOptimizer(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
                std::shared_ptr<ProcessGroup> process_group, ZeroOptions options = {});
  template <typename ModuleImpl>
  ZeroOptimizer(const torch::nn::ModuleHolder<ModuleImpl>& model,
                torch::optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> process_group,
                ZeroOptions options = {})
      : ZeroOptimizer(std::static_pointer_cast<torch::nn::Module>(model.ptr()), optimizer,
                      std::move(process_group), options) {}
  // HSDP: shards over `shard_group` and replicates across `replicate_group`
  // (this rank's counterparts in the other shard groups: ProcessMesh's
  // group("local") and group("host"), or a mesh with an explicit shape
  // {replicas, shard size}). Every rank starts from the values of the first
  // rank of replicate rank 0's shard group (world rank 0, on a mesh).
  // `replicate_group` may have one rank (then this is plain ZeRO over the
  // shard group); stage 1 with more is a UsageError. Collective over both.
  ZeroOptimizer(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
                std::shared_ptr<ProcessGroup> shard_group,
                std::shared_ptr<ProcessGroup> replicate_group, ZeroOptions options);
  template <typename ModuleImpl>
  ZeroOptimizer(const torch::nn::ModuleHolder<ModuleImpl>& model,
                torch::optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> shard_group,
                std::shared_ptr<ProcessGroup> replicate_group, ZeroOptions options)
      : ZeroOptimizer(std::static_pointer_cast<torch::nn::Module>(model.ptr()), optimizer,
                      std::move(shard_group), std::move(replicate_group), options) {}
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Updates this rank's shards from the reduced gradients with the
  // optimizer's current hyperparameters, then makes the parameters whole
  // again (stages 1 and 2). Collective.
  void step();
  // Clears the gradients (shards, or the flat buffers in stage 1).
  void zero_grad();

  // Scales the gradients so that their global L2 norm is at most max_norm;
  // returns the norm before clipping (every rank gets the same value).
  // Collective. Call after backward, before step().
  double clip_grad_norm(double max_norm);
  // The global L2 norm of the gradients, without clipping. Collective.
  double grad_norm();

  // The fp32 gradient shards this rank updates from (stage 1: views of its
  // share of the averaged gradients). For loss-scaler unscaling and overflow
  // checks; valid until the next backward.
  std::vector<at::Tensor> gradient_shards();

  // Stage 1 only: false makes the next backward accumulate locally without
  // communicating (DDP's no_sync). Ignored by stages 2 and 3.
  void set_gradient_sync(bool enabled);
  bool gradient_sync() const;

  // Stage 3: makes every parameter whole on every rank while the guard
  // lives (to read, evaluate or save them), and frees them again after,
  // keeping any change made to them in the meantime. Collective, on entry
  // and exit. Stages 1 and 2: nothing to do.
  //
  // DeepSpeed's GatheredParameters(params, modifier_rank): only the units
  // holding `params` (the model's own parameter tensors, the same list on
  // every rank) are made whole. On exit, with `modifier_rank`, what that
  // rank holds in them is broadcast and kept on every rank (the way to
  // change a parameter on one rank, e.g. an initialisation read from a
  // file there); without it, every change is discarded, as in DeepSpeed.
  // Parameters stage 3 keeps whole (outside every unit, or under
  // param_persistence_threshold) and frozen ones follow the same rules.
  // Guards nest.
  // UsageError for a tensor that is no parameter of the sharded model.
  class GatheredParameters {
   public:
    explicit GatheredParameters(ZeroOptimizer& zero);
    GatheredParameters(ZeroOptimizer& zero, const std::vector<at::Tensor>& params,
                       std::optional<int> modifier_rank = std::nullopt);
    ~GatheredParameters() noexcept(false);
    GatheredParameters(const GatheredParameters&) = delete;
    GatheredParameters& operator=(const GatheredParameters&) = delete;

   private:
    ZeroOptimizer& zero_;
    bool some_ = false;  // the (params, modifier_rank) form
    std::optional<int> modifier_rank_;
  };

  int stage() const;
  const ZeroOptions& options() const;
  // The group the state is sharded over (the shard group under HSDP).
  ProcessGroup& process_group() const;
  // HSDP: the group the gradient shards are all-reduced across; null when
  // the optimizer was built without one.
  ProcessGroup* replicate_group() const;
  // Bytes held now; stage 3 parameters count what is gathered at the moment.
  ZeroMemoryStats memory_stats() const;
  // Introspection: buckets (stage 1/2) or units (stage 3, then the group of
  // parameters outside every unit) as parameter names.
  std::vector<std::vector<std::string>> group_parameter_names() const;
  // Completed optimizer steps.
  int64_t step_count() const;

  // Stages 2 and 3 (and HSDP): where the time and the bytes go, summed
  // since construction or the last reset. The collectives run on the communication thread; `*_wait`
  // is the part the training thread spent blocked on them (the rest
  // overlapped compute).
  // Byte counts are payloads: the size of the whole tensor each collective
  // reduces or gathers (what one rank would send were it alone), not what
  // a ring puts on the wire (about 2(n-1)/n of it for an all-reduce).
  struct CommStats {
    double gather_seconds = 0;          // all-gathers of unit parameters
    double reduce_scatter_seconds = 0;  // gradient reduce-scatters (stages 2, 3)
    double gather_wait_seconds = 0;     // forward/backward blocked on a gather
    double drain_wait_seconds = 0;      // end of backward and step blocked on the queue
    // Stages 1 and 2: the all-gathers of the updated partitions at the end
    // of step() (and after a load), which the training thread runs itself.
    double update_gather_seconds = 0;
    int64_t gathers = 0;
    int64_t reduce_scatters = 0;
    // Gradient packs all-reduced instead (reduce_scatter false).
    int64_t gradient_all_reduces = 0;
    // All-gather calls issued for parameters (allgather_bucket_size splits
    // one group's all-gather into several).
    int64_t parameter_all_gather_calls = 0;
    // Gradient reductions queued while backward was still running (0 with
    // overlap_comm false).
    int64_t reductions_launched_in_backward = 0;
    int64_t gather_bytes = 0;          // whole units gathered (stage 3)
    int64_t reduce_scatter_bytes = 0;  // packed fp32 gradients reduce-scattered
    // HSDP: the all-reduces of gradient shards across the replicate group,
    // the only traffic between shard groups.
    double replicate_all_reduce_seconds = 0;
    int64_t replicate_all_reduces = 0;
    int64_t replicate_bytes = 0;
    // replicate_bytes between the last two step() calls (or since the
    // reset before the last step()): inter-group bytes per optimizer step.
    int64_t last_step_replicate_bytes = 0;
  };
  CommStats comm_stats() const;
  // Zeroes comm_stats() and restarts memory_stats()'s gathered peak.
  void reset_stats();
  // Seconds the training thread has spent blocked on this optimizer's
  // communication since construction: the sum of gather_wait_seconds,
  // drain_wait_seconds and update_gather_seconds, which reset_stats() does
  // not zero (the Accelerator's wall_clock_breakdown takes differences).
  // Thread-safe.
  double communication_wait_seconds() const;

  // ---- Checkpoints (what Accelerator::save_state and load_state use) ------
  // A stretch of this rank's shard that lies in one parameter, as views of
  // the shard tensors (valid until the next step or load).
  struct ShardFragment {
    std::string name;   // the parameter's module path
    int64_t begin = 0;  // first element within the flattened parameter
    at::Tensor value;   // parameter values, in the parameter's dtype
    at::Tensor master;  // fp32 master values; undefined when `value` is its own master
    std::vector<at::Tensor> state;  // optimizer state, in state_names() order
  };
  std::vector<ShardFragment> shard_fragments() const;
  // Names of the optimizer state kept per element: exp_avg and exp_avg_sq
  // (Adam, AdamW, Lamb), momentum_buffer (SGD with momentum), sum
  // (Adagrad), square_avg [momentum_buffer] [grad_avg] (RMSprop), exp_avg
  // (Lion), or none (SGD without momentum). UsageError with a
  // shard_optimizer_factory (its state has no names tandem knows).
  std::vector<std::string> state_names() const;
  // Elements [begin, begin + length) of parameter `name` in `section`
  // ("model", "master" or a state name) as a 1-D tensor of any dtype, or an
  // undefined tensor when there is none (master: taken from the model
  // values; state: zeros).
  using FragmentSource = std::function<at::Tensor(const std::string& section,
                                                  const std::string& name, int64_t begin,
                                                  int64_t length)>;
  // Overwrites this rank's shards from `source` (stages 1 and 2 then
  // all-gather the whole parameters) and sets the step count. Call between
  // steps, outside GatheredParameters. Collective: when `source` throws on
  // one rank, that rank still joins every all-gather and then rethrows (its
  // step count unchanged), so the others return rather than hang; agree on
  // the outcome when every rank must know (Accelerator::load_state does).
  void load_shards(const FragmentSource& source, int64_t step_count);
  // Fills `dst` (a 1-D view of this rank's shard memory, in the parameter's
  // dtype, or its fp32 master when there is one) with elements
  // [begin, begin + dst.numel()) of parameter `name`; returns false to keep
  // the current values of that stretch.
  using ShardFill =
      std::function<bool(const std::string& name, int64_t begin, const at::Tensor& dst)>;
  // Overwrites the parameter values of this rank's shards (and their fp32
  // masters) in place from `fill`, then makes the parameters of stages 1
  // and 2 (and stage 3's loose ones) whole again by all-gather; the
  // optimizer state, the gradients and the step count stay as they are.
  // What pretrained weights load through (tandem/zero/zero_weights.h). Call
  // between steps, outside GatheredParameters. Collective; `fill` must not
  // issue collectives, and if it throws on one rank the others are left in
  // the all-gather, so catch inside it.
  void load_parameter_shards(const ShardFill& fill);
  // The model this optimizer shards.
  torch::nn::Module& module() const;
  // Calls fn(name, whole parameter) for every parameter ZeRO manages, in
  // layout order. Stage 3 gathers one unit at a time and frees it after, so
  // at most one unit is whole beyond what training holds. Collective.
  void for_each_whole_parameter(
      const std::function<void(const std::string&, const at::Tensor&)>& fn);

 private:
  std::unique_ptr<detail::ZeroEngine> engine_;
};

}  // namespace tandem
