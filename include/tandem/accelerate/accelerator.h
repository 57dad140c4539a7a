#pragma once
// Accelerator: a plain LibTorch training loop, distributed in a few lines.
//
//   tandem::Accelerator accelerator;                    // joins the job
//   auto adam = std::make_shared<torch::optim::Adam>(model->parameters(), 1e-3);
//   auto [optimizer, loader] = accelerator.prepare(model, adam, {x, y}, 64);
//   for (auto& batch : *loader) {
//     optimizer->zero_grad();
//     accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
//     optimizer->step();
//   }
//
// Construction resolves the config (file, then environment, then the code
// overrides in AcceleratorOptions), joins the process group, and picks the
// device (cuda:LOCAL_RANK when CUDA is available and not refused, else cpu).
// prepare() moves the model to the device and wraps it for the strategy (DDP,
// or ZeRO stage 1-3 with its optimizer), shards the data, and hands back an optimizer and
// loader that follow the accumulation rules (see tandem/accelerate/prepared.h).
//
// Several models, optimizers and schedulers (a GAN's two players, a frozen
// encoder with a trained head, distillation) are prepared one by one, as in
// Accelerate: each model gets its own DDP wrapper (or, under ZeRO, is
// sharded with the optimizer over its parameters), they share one
// micro-step schedule, and save_state()/load_state() cover them all.
//
// Every collective method (prepare, wait_for_everyone, gather, reduce, ...)
// must be called by every rank in the same order. One training thread.
//
// Ownership: everything prepare() returns is a std::shared_ptr that shares
// ownership of what it wraps and of the micro-step state, so the returned
// objects, the Accelerator and the model may be destroyed in any order.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include "tandem/accelerate/accelerator_options.h"
#include "tandem/accelerate/checkpointable.h"
#include "tandem/accelerate/example_loader.h"
#include "tandem/accelerate/gradient_state.h"
#include "tandem/accelerate/metrics_logger.h"
#include "tandem/accelerate/tensorboard_writer.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/accelerate/profiler.h"
#include "tandem/accelerate/progress_bar.h"
#include "tandem/accelerate/wall_clock.h"
#include "tandem/amp/autocast.h"
#include "tandem/amp/loss_scaler.h"
#include "tandem/checkpoint/module_weights.h"
#include "tandem/comm/objects.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/split.h"
#include "tandem/config/config.h"
#include "tandem/core/rank_env.h"
#include "tandem/data/distributed_loader.h"
#include "tandem/parallel/ddp.h"
#include "tandem/zero/init.h"
#include "tandem/zero/zero_optimizer.h"

namespace torch::autograd {
struct Node;
}

namespace tandem {

namespace detail {
struct JoinHooks;
class ModelStrategy;
class StepController;
class StrategyFactory;
struct StateHooks;
class WallClockTimer;
}  // namespace detail

class LRScheduler;
class CheckpointReader;
class LocalSGD;

class Accelerator {
 public:
  // Reads the rank environment and the config environment once, loads the
  // config file, resolves it, and joins the job. Throws UsageError for a bad
  // config or a setting that is not available (the message says which).
  explicit Accelerator(AcceleratorOptions options = {});

  // Joins through a process group the program already has (from
  // tandem::ProcessGroup::init, or ranks as threads over one store) with a
  // config it loaded itself; reads no environment. `launcher` stands in for
  // what a launcher would have exported (TANDEM_* overrides, LOCAL_RANK,
  // LOCAL_WORLD_SIZE); by default there are no overrides and the node is
  // the whole group.
  Accelerator(std::shared_ptr<ProcessGroup> process_group, Config config,
              AcceleratorOptions options = {}, LauncherEnv launcher = {});

  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- What the job is -----------------------------------------------------
  // The resolved config; the batch triple is final after prepare() of data.
  const Config& config() const { return config_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  c10::Device device() const { return device_; }
  MixedPrecision mixed_precision() const { return config_.mixed_precision; }
  int64_t gradient_accumulation_steps() const;

  int process_index() const;        // global rank
  int local_process_index() const;  // rank on this node
  int num_processes() const;        // world size
  bool is_main_process() const { return process_index() == 0; }
  bool is_local_main_process() const { return local_process_index() == 0; }

  // ---- prepare -------------------------------------------------------------
  // Every prepare method returns a std::shared_ptr (a ModuleHolder for the
  // model) that shares ownership of what it wraps.

  // Moves `model` to the device and wraps it (DDP: broadcast from rank 0,
  // hooks for overlapped bucketed all-reduce). The module object is the same
  // one afterwards, and so is the returned holder: keep calling
  // model->forward(). With the config's activation_checkpointing block, its
  // tandem::Checkpointed blocks are switched on. Once per model; any number
  // of models (each its own
  // DDP wrapper; under ZeRO each is sharded when the optimizer over its
  // parameters is prepared, and a model no optimizer covers, such as a
  // frozen one, stays whole, its frozen parameters and buffers broadcast
  // from rank 0).
  // Checkpoints name model k >= 1's tensors "model_<k>." + module path.
  template <typename ModuleImpl>
  torch::nn::ModuleHolder<ModuleImpl> prepare_model(
      const torch::nn::ModuleHolder<ModuleImpl>& model) {
    prepare_model(std::static_pointer_cast<torch::nn::Module>(model.ptr()));
    return model;
  }
  std::shared_ptr<torch::nn::Module> prepare_model(std::shared_ptr<torch::nn::Module> model);

  // Build the model inside this guard, on every rank with the same seed:
  // under ZeRO stage 3 with `zero3_init` (Accelerate's zero3_init_flag) it is
  // a tandem::zero::Init over this process group, so each tandem::Sharded
  // unit is cut to this rank's shard as it is built and no rank ever holds the
  // whole model (see tandem/zero/init.h); otherwise it does nothing.
  //   torch::manual_seed(0);
  //   std::optional<Gpt> model;
  //   { auto init = accelerator.zero_init(); model.emplace(config); }
  [[nodiscard]] zero::Init zero_init() const;

  // Takes over `optimizer` and returns the optimizer to step from now on: a
  // torch::optim::Optimizer whose step() and zero_grad() follow the
  // micro-step rules, loss scaling and clipping from the config (see
  // AcceleratedOptimizer). `optimizer`'s param groups and state move into
  // it; stepping `optimizer` itself afterwards is refused (UsageError). Call
  // it after prepare_model() and before the first step: when the model's
  // parameters are bf16/fp16 it replaces them in the param groups with fp32
  // master copies (on the model's device). Any number of optimizers, over
  // disjoint parameters (UsageError for a parameter another prepared
  // optimizer holds). Under ZeRO an optimizer's parameters must all belong
  // to one prepared model, which it shards.
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer(
      std::shared_ptr<torch::optim::Optimizer> optimizer);

  // Builds the optimizer that the config's `optimizer` block describes
  // (DeepSpeed's {"type": "AdamW", "params": {...}}; Adam, AdamW or SGD)
  // over the prepared model's parameters, and prepares it. `default_lr`
  // stands in for a missing or "auto" lr. Call after prepare_model(), with
  // one model prepared (or name the model); UsageError without an optimizer
  // block.
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer_from_config(double default_lr = 0.0);
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer_from_config(
      const std::shared_ptr<torch::nn::Module>& model, double default_lr = 0.0);

  // Wraps a scheduler (built over a prepared optimizer, or over the one
  // passed to prepare_optimizer()) so that it steps once per real step of
  // that optimizer. The result owns the scheduler and keeps the prepared
  // optimizer alive. A tandem::LRScheduler names its optimizer; a LibTorch
  // scheduler does not, so with several optimizers prepared pass the one it
  // drives (UsageError otherwise).
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(std::shared_ptr<LRScheduler> scheduler);
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(
      std::shared_ptr<torch::optim::LRScheduler> scheduler,
      std::shared_ptr<AcceleratedOptimizer> optimizer = nullptr);
  // Builds the config's `scheduler` block (DeepSpeed's WarmupLR, ...) over
  // `optimizer`, filling "auto" values: warmup_max_lr/cycle_max_lr from the
  // optimizer's lr, total_num_steps from `total_num_steps` (0: not known).
  // Throws UsageError when the config has no scheduler block.
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler_from_config(
      const std::shared_ptr<AcceleratedOptimizer>& optimizer, int64_t total_num_steps = 0);

  // Shards tensors (one per field, rows in dim 0) or a torch::data dataset
  // across ranks, with `options.batch_size` samples per process per batch
  // (even batches by default), as Accelerate's prepare_data_loader. The
  // first loader prepared is the training data: its batch size becomes the
  // config's train_micro_batch_size_per_gpu and completes the batch triple;
  // later ones (evaluation) change nothing.
  std::shared_ptr<PreparedLoader> prepare_data_loader(std::vector<at::Tensor> tensors,
                                                      DistributedLoaderOptions options);
  std::shared_ptr<PreparedLoader> prepare_data_loader(std::vector<at::Tensor> tensors,
                                                      int64_t batch_size) {
    DistributedLoaderOptions options;
    options.batch_size = batch_size;
    return prepare_data_loader(std::move(tensors), options);
  }
  // Any dataset of `dataset_size` samples that `fetch` assembles into a
  // batch from a list of indices, e.g. tandem::collate_fetch(get_sample,
  // tandem::PadCollate{}) for variable-length samples (tandem/data/collate.h);
  // with options.num_workers the fetches run on worker threads.
  std::shared_ptr<PreparedLoader> prepare_data_loader(DistributedLoader::Fetch fetch,
                                                      int64_t dataset_size,
                                                      DistributedLoaderOptions options);
  // A torch::data dataset (size() and get(i) returning Example<>) gives a
  // loader of stacked Example<> batches (batch.data, batch.target).
  template <typename Dataset>
  auto prepare_data_loader(Dataset dataset, DistributedLoaderOptions options) {
    using ExampleType = decltype(dataset.get(size_t{0}));
    using Target = typename ExampleType::TargetType;
    options = data_options(options);
    auto [fetch, size] = detail::dataset_fetch(std::move(dataset));
    return std::make_shared<ExampleLoader<Target>>(
        wrap_loader(DistributedLoader(std::move(fetch), size, *process_group_, options)));
  }
  template <typename Dataset>
  auto prepare_data_loader(Dataset dataset, int64_t batch_size) {
    DistributedLoaderOptions options;
    options.batch_size = batch_size;
    return prepare_data_loader(std::move(dataset), options);
  }

  // Wraps a loader built in code as it is, without resharding: e.g. over
  // this rank's own files, DistributedLoader(tensors, 1, 0, options), whose
  // batch counts may differ across ranks (train it under
  // join_uneven_inputs()). Like prepare_data_loader(), the first loader
  // prepared is the training data.
  std::shared_ptr<PreparedLoader> prepare_local_loader(DistributedLoader loader);

  // Everything at once: the model, its optimizer and the training data
  // (tensors, or a torch::data dataset, with a batch size per process or
  // loader options), and optionally a scheduler. Returns {optimizer, loader}
  // or {optimizer, loader, scheduler}, to use in place of the originals.
  template <typename Model, typename Data, typename Batch>
  auto prepare(const Model& model, std::shared_ptr<torch::optim::Optimizer> optimizer, Data data,
               Batch batch) {
    prepare_model(model);
    auto loader = prepare_data_loader(std::move(data), batch);
    return std::make_tuple(prepare_optimizer(std::move(optimizer)), std::move(loader));
  }
  template <typename Model, typename Batch>
  auto prepare(const Model& model, std::shared_ptr<torch::optim::Optimizer> optimizer,
               std::vector<at::Tensor> tensors, Batch batch) {
    prepare_model(model);
    auto loader = prepare_data_loader(std::move(tensors), batch);
    return std::make_tuple(prepare_optimizer(std::move(optimizer)), std::move(loader));
  }
  template <typename Model, typename Data, typename Batch, typename Scheduler>
  auto prepare(const Model& model, std::shared_ptr<torch::optim::Optimizer> optimizer, Data data,
               Batch batch, std::shared_ptr<Scheduler> scheduler) {
    auto [prepared_optimizer, loader] =
        prepare(model, std::move(optimizer), std::move(data), batch);
    return std::make_tuple(std::move(prepared_optimizer), std::move(loader),
                           prepare_scheduler(std::move(scheduler)));
  }
  template <typename Model, typename Batch, typename Scheduler>
  auto prepare(const Model& model, std::shared_ptr<torch::optim::Optimizer> optimizer,
               std::vector<at::Tensor> tensors, Batch batch, std::shared_ptr<Scheduler> scheduler) {
    auto [prepared_optimizer, loader] =
        prepare(model, std::move(optimizer), std::move(tensors), batch);
    return std::make_tuple(std::move(prepared_optimizer), std::move(loader),
                           prepare_scheduler(std::move(scheduler)));
  }

  // ---- Stepping ------------------------------------------------------------
  // Autocast for the forward pass and the loss, per the mixed-precision
  // mode (bf16 on CPU or CUDA, fp16 on CUDA; nothing for "no"):
  //   { auto autocast = accelerator.autocast(); loss = loss_fn(model->forward(x), y); }
  // Nestable and exception-safe; see tandem/amp/autocast.h.
  AutocastGuard autocast() const { return AutocastGuard(device_.type(), config_.mixed_precision); }

  // loss.backward(), with the loss cast to fp32, multiplied by the loss
  // scale (fp16) and divided by gradient_accumulation_steps. Outside an
  // accumulate() guard every call begins a micro-step, so a loop that sums
  // several losses should call backward() once on their sum (or use the
  // guard, inside which backward() may be called any number of times).
  // Outside an accumulate() guard it also begins the micro-step (deciding
  // whether this backward all-reduces). `loss` must be a scalar.
  void backward(const at::Tensor& loss);

  // RAII guard for one micro-step: gradients are synchronised only on
  // accumulation boundaries and on the last batch of a pass.
  class AccumulateGuard {
   public:
    ~AccumulateGuard();
    AccumulateGuard(const AccumulateGuard&) = delete;
    AccumulateGuard& operator=(const AccumulateGuard&) = delete;

   private:
    friend class Accelerator;
    explicit AccumulateGuard(std::shared_ptr<detail::StepController> controller);
    std::shared_ptr<detail::StepController> controller_;
    bool outer_was_open_;
  };
  // Begins a micro-step. The models are prepared ones, as in Accelerate's
  // accumulate(a, b) (UsageError for another one); one micro-step covers
  // every backward inside the guard, whichever models it reaches (a GAN's
  // discriminator and generator losses).
  template <typename... Models>
  [[nodiscard]] AccumulateGuard accumulate(const Models&... models) {
    (check_prepared(module_of(models), "accumulate"), ...);
    return AccumulateGuard(controller_);
  }

  // True when the current micro-step synchronises gradients (an optimizer
  // step will happen).
  bool sync_gradients() const;
  // Real optimizer steps taken so far.
  int64_t step() const;

  // Clips the gradients of the prepared optimizer's parameters to a global
  // norm of `max_norm` and returns the norm before clipping. Gradients are
  // unscaled first (once per step), so the norm is the true one. On
  // micro-steps that do not synchronise it does nothing and returns NaN (the
  // gradients are partial sums); when the step overflowed it returns inf and
  // the optimizer will skip the step. With several optimizers, name the one
  // whose parameters to clip (UsageError otherwise).
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  double clip_grad_norm(const std::shared_ptr<AcceleratedOptimizer>& optimizer, double max_norm,
                        double norm_type = 2.0);

  // Clamps every gradient of every prepared optimizer's parameters to
  // [-clip_value, clip_value], as Accelerate's clip_grad_value_: unscaled
  // first under loss scaling (once per step, so the bound applies to the
  // true gradients); under ZeRO the reduced fp32 gradient shards each rank
  // steps from are clamped (element-wise, so clamping shards equals
  // clamping whole gradients). On micro-steps that do not synchronise it
  // does nothing (the gradients are partial sums), and when the step
  // overflowed it leaves the inf/NaN gradients alone (the step is skipped).
  // Not a collective under DDP; under ZeRO with loss scaling every rank
  // must call it (the overflow check agrees across ranks). UsageError for a
  // clip_value that is not positive and finite.
  void clip_grad_value(double clip_value);

  // Gradient synchronisation off for one prepared model (Accelerate's
  // no_sync, DDP's no_sync): every backward() inside the guard accumulates
  // gradients locally on each rank and communicates nothing; the first
  // synchronising backward after it reduces everything accumulated.
  //   { auto guard = accelerator.no_sync(model); accelerator.backward(loss); }
  // Only the model's communication changes: the micro-step schedule
  // (sync_gradients(), the loss division by gradient_accumulation_steps)
  // and the prepared optimizer's step() are as without the guard, as in
  // Accelerate, so a step() inside the guard steps each rank on its own
  // gradients (what LocalSGD wants; ranks then drift apart until averaged).
  // Nestable. ZeRO stage 1 accumulates locally like DDP; stages 2 and 3
  // partition the gradients and reduce-scatter every backward, so no_sync
  // is refused there (UsageError, as DeepSpeed's no_sync): use
  // gradient_accumulation_steps instead. Does nothing on one process. Call
  // outside backward; the guard must not outlive the Accelerator.
  class NoSyncGuard {
   public:
    ~NoSyncGuard();
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    friend class Accelerator;
    NoSyncGuard(std::shared_ptr<detail::ModelStrategy> strategy,
                std::shared_ptr<detail::StepController> controller);
    std::shared_ptr<detail::ModelStrategy> strategy_;
    std::shared_ptr<detail::StepController> controller_;
  };
  template <typename Model>
  [[nodiscard]] NoSyncGuard no_sync(const Model& model) {
    return no_sync_at(check_prepared(module_of(model), "no_sync"));
  }

  // The loss scale of the next backward (1 without fp16 loss scaling), and
  // the optimizer steps skipped so far because gradients overflowed.
  double loss_scale() const { return scaler_->scale(); }
  int64_t skipped_steps() const { return scaler_->skipped_steps(); }
  LossScaler& loss_scaler() const { return *scaler_; }

  // ---- Uneven inputs (Join) ------------------------------------------------
  // While the returned guard lives, passes of prepared loaders that start in
  // it are joined: no padding (each rank sees exactly its share), and ranks
  // that run out of data first take shadow steps on a stand-in batch (their
  // last one) until every rank is out, so the loop body, and every
  // collective in it, runs the same number of times everywhere. A shadow
  // step's gradient counts as zero and each step's gradient is the mean over
  // the K ranks that had a real batch (not over the world), so parameters
  // and optimizer state stay identical on every rank. See
  // docs/architecture.md ("Uneven inputs").
  //   auto join = accelerator.join_uneven_inputs();
  //   for (auto& batch : *loader) { ...same loop body... }
  // Call on every rank, after prepare_model() and outside a pass of the
  // training loader; one guard at a time (UsageError otherwise).
  class JoinGuard {
   public:
    ~JoinGuard();
    JoinGuard(const JoinGuard&) = delete;
    JoinGuard& operator=(const JoinGuard&) = delete;

   private:
    friend class Accelerator;
    explicit JoinGuard(std::shared_ptr<detail::StepController> controller);
    std::shared_ptr<detail::StepController> controller_;
  };
  [[nodiscard]] JoinGuard join_uneven_inputs();
  // True when this rank's current batch is a shadow one (joined pass, this
  // rank out of data): its outputs are not real samples, so skip logging.
  bool is_shadow_batch() const;
  // The current step's ranks with a real batch: num_processes() outside a
  // joined pass.
  int64_t ranks_with_data() const;
  // A snapshot of the micro-step state (a copy: it does not follow later
  // steps).
  GradientState gradient_state() const;

  // ---- Helpers -------------------------------------------------------------
  // Prints on the main process only.
  template <typename... Args>
  void print(fmt::format_string<Args...> f, Args&&... args) const {
    if (is_main_process()) print_line(fmt::format(f, std::forward<Args>(args)...));
  }
  void print_line(const std::string& line) const;

  // Barrier across all ranks.
  void wait_for_everyone();
  // Runs `fn` on the main process first, then on the others (downloads,
  // data preparation, cache building).
  void main_process_first(const std::function<void()>& fn);
  // Same per node: local rank 0 first.
  void local_main_process_first(const std::function<void()>& fn);

  // Concatenation of every rank's `tensor` along dim 0 (0-dim tensors are
  // stacked). Shapes must match across ranks except dim 0 differences,
  // which are padded away for you.
  at::Tensor gather(const at::Tensor& tensor);
  // gather() with the duplicate samples that even batches add on the last
  // batch of a pass removed: feed it the per-sample outputs of the current
  // batch and the result has exactly one row per real sample. In a joined
  // pass (join_uneven_inputs) the rows of ranks on a shadow batch are
  // dropped whole.
  at::Tensor gather_for_metrics(const at::Tensor& tensor);
  // Element-wise reduction across ranks of a copy of `tensor`.
  at::Tensor reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Pads `tensor` along `dim` to the largest size any rank has.
  at::Tensor pad_across_processes(const at::Tensor& tensor, int64_t dim = 0,
                                  double pad_index = 0, bool pad_first = false);

  // Objects across ranks (tandem/comm/objects.h): every rank's string, JSON
  // value or CPU tensor (any shape and dtype per rank), indexed by rank; and
  // rank `src`'s object on every rank. Collectives.
  template <typename T>
  auto gather_object(const T& object) {
    return tandem::gather_object(*process_group_, object);
  }
  template <typename T>
  void broadcast_object(T& object, int src = 0) {
    tandem::broadcast_object(*process_group_, object, src);
  }
  // This process's contiguous share of `items` (a std::vector or a tensor's
  // rows), as Accelerate's split_between_processes; with `apply_padding`
  // every process gets as many, the short ones padded with the last item.
  // Not a collective.
  template <typename Items>
  auto split_between_processes(const Items& items, bool apply_padding = false) const {
    return tandem::split_between_processes(items, process_index(), num_processes(),
                                           apply_padding);
  }

  // A flag any rank may raise (an early-stopping condition, a NaN loss seen
  // by one rank), as Accelerate's set_trigger/check_trigger. set_trigger()
  // is local and not a collective. check_trigger() is a collective (one
  // one-element all-reduce): it returns true on every rank when any rank
  // set the flag since the last check that returned true, and then clears
  // it everywhere.
  //   if (loss.isnan().item<bool>()) accelerator.set_trigger();
  //   if (accelerator.check_trigger()) break;
  void set_trigger() { trigger_ = true; }
  bool check_trigger();

  // Releases this Accelerator's references to everything prepared (models
  // and their DDP/ZeRO wrappers, optimizers, schedulers, loaders, the join
  // hooks), resets the step count to 0, and, when CUDA is present, returns
  // the CUDA caching allocator's unused blocks to the driver (Accelerate's
  // free_memory / clear). Objects the program still holds stay valid but
  // are no longer this Accelerator's: save_state() and load_state() no
  // longer cover them. Afterwards prepare fresh objects as after
  // construction (find_executable_batch_size retries do exactly this). The
  // loss scaler and the trackers are kept. Call between steps, outside any
  // guard; collective in the sense that every rank must do it at the same
  // point (it communicates nothing itself).
  void free_memory();

  // Runs fn(batch_size) from `starting_batch_size`, halving the batch size
  // after an out-of-memory error (c10::OutOfMemoryError, which LibTorch's
  // CUDA and CPU allocators throw, or std::bad_alloc) until a call returns;
  // returns the batch size that ran (Accelerate's find_executable_batch_size,
  // as a method: the ranks must agree). After every attempt the ranks agree
  // (one all-gather of each rank's outcome), so when only some ranks ran out
  // of memory every rank retries with the same halved size, and fn has run
  // the same number of times with the same sizes everywhere. Any other
  // exception is rethrown on the rank that raised it and reported as an
  // Error naming that rank on the others. UsageError when even batch size 1
  // runs out of memory, or for starting_batch_size < 1. Call fn's cleanup
  // (free_memory(), dropping tensors) inside fn. Limitation: an OOM that
  // strikes while the other ranks wait in a collective with this one
  // (inside DDP's backward, say) cannot be agreed on: they wait until the
  // process group's timeout and fail with its CommError. Allocate the
  // batch's big tensors before the first collective of an attempt (the
  // forward pass usually does) to keep OOMs agreeable. Collective.
  int64_t find_executable_batch_size(const std::function<void(int64_t)>& fn,
                                     int64_t starting_batch_size);

  // The bare module: its state dict has no wrapper prefix (no "module.").
  // The first prepared model (null before any).
  std::shared_ptr<torch::nn::Module> unwrap_model() const;
  // The ZeRO optimizer that shards the first prepared model (or `model`)
  // when the config's zero_optimization.stage is 1-3 (after its optimizer
  // was prepared), else nullptr. Stage 3: wrap reads of the whole
  // parameters in ZeroOptimizer::GatheredParameters.
  std::shared_ptr<ZeroOptimizer> zero_optimizer() const;
  std::shared_ptr<ZeroOptimizer> zero_optimizer(const std::shared_ptr<torch::nn::Module>& model) const;
  // Parameters and buffers by module path, whole and cloned to the CPU: of
  // the first prepared model, or of `model`. Under ZeRO-3 the partitioned
  // parameters are gathered one unit at a time (also inside a
  // GatheredParameters guard), so it is collective: call it on every rank.
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict() const;
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict(
      const std::shared_ptr<torch::nn::Module>& model) const;

  // ---- Checkpoints ---------------------------------------------------------
  // Saves everything needed to resume exactly: the models, the optimizers
  // (every ZeRO shard), the schedulers, the loss scaler, the training
  // loader's epoch and position, each rank's RNG states, the step counter
  // and `options.client_state`, as DIR/<tag> (safetensors + JSON, no
  // pickle), then points DIR/latest at it. Atomic: either every rank's part
  // is written, fsynced and committed, or nothing changes and every rank
  // throws CheckpointError. Call after optimizer->step() (not between the
  // micro-steps of an accumulation cycle, whose partial gradients a
  // checkpoint does not hold: UsageError). Collective.
  void save_state(const std::string& dir, const SaveStateOptions& options = {});
  // Restores a save_state() checkpoint into this run's prepared objects
  // (prepare everything first, as in the run that saved it) and returns its
  // client state. The checkpoint may come from another world size or
  // strategy (DDP, ZeRO 1-3): parameters and optimizer state are resharded.
  // The next batch of the training loader is the one after the saved
  // position. UsageError when the model or optimizer does not match the
  // checkpoint; CheckpointError for a missing or corrupt one. Collective.
  nlohmann::json load_state(const std::string& dir, const LoadStateOptions& options = {});
  // Registers `object` (anything with state: a custom counter, an EMA, a
  // sampler of its own) so that save_state() saves it and load_state()
  // restores it, as Accelerate's register_for_checkpointing. The objects are
  // saved in registration order as custom_checkpoint_<i> (their JSON in the
  // checkpoint's metadata, their tensors under "custom_checkpoint_<i>/"),
  // from rank 0's object (as Accelerate saves from the main process); on
  // load every rank's object gets rank 0's saved state. load_state()
  // refuses a checkpoint holding a different number of custom objects
  // (UsageError, before anything is restored): register the same objects in
  // the same order. The Accelerator shares ownership. Not a collective;
  // every rank registers the same objects.
  void register_for_checkpointing(std::shared_ptr<Checkpointable> object);
  // The same for a pair of functions (state_dict, load_state_dict).
  void register_for_checkpointing(std::function<CustomState()> state_dict,
                                  std::function<void(const CustomState&)> load_state_dict);

  // Functions save_state() and load_state() call first, on every rank, with
  // the prepared models (in preparation order) and the directory they were
  // given, before anything is written or read (Accelerate's
  // register_save_state_pre_hook / register_load_state_pre_hook). Use them
  // to save or load what tandem does not (a tokenizer, an adapter's own
  // files) next to the checkpoint. Unlike Accelerate the hooks cannot take
  // models out of the checkpoint: every prepared model is saved and loaded,
  // since load_state() reshards them and checks the architecture. A hook
  // that throws aborts the save or load on that rank (the others then fail
  // in the commit). Hooks run in registration order. Not thread-safe.
  using StatePreHook = std::function<void(
      const std::vector<std::shared_ptr<torch::nn::Module>>& models, const std::string& dir)>;
  // Removes its hook (Accelerate's RemovableHandle); removing twice, or
  // after the Accelerator is gone, does nothing. Dropping the handle keeps
  // the hook.
  class HookHandle {
   public:
    void remove();

   private:
    friend class Accelerator;
    HookHandle(std::weak_ptr<detail::StateHooks> hooks, bool save, int64_t id)
        : hooks_(std::move(hooks)), save_(save), id_(id) {}
    std::weak_ptr<detail::StateHooks> hooks_;
    bool save_;
    int64_t id_;
  };
  HookHandle register_save_state_pre_hook(StatePreHook hook);
  HookHandle register_load_state_pre_hook(StatePreHook hook);

  // True when DIR holds a committed checkpoint that load_state(dir) would
  // load (a `latest` file naming a complete tag).
  static bool has_checkpoint(const std::string& dir);
  // Writes the consolidated weights (parameters and buffers, keyed by
  // module path, in the model's dtype) to DIR/model.safetensors, from rank
  // 0. Streams one parameter (stage 3: one unit) at a time, so no rank ever
  // holds a second copy of the model. The first prepared model, or `model`
  // (Accelerate's save_model(model, dir)). Under ZeRO-3 the config's
  // stage3_gather_16bit_weights_on_model_save (zero3_save_16bit_model)
  // decides: true writes the parameters in the 16-bit training dtype (bf16 or
  // fp16 under mixed precision), false throws UsageError on every rank, as
  // Accelerate does (save_state() then `tandem checkpoint merge` instead),
  // not given keeps the parameters' dtype. Collective.
  void save_model(const std::string& dir);
  void save_model(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir);
  template <typename ModuleImpl>
  void save_model(const torch::nn::ModuleHolder<ModuleImpl>& model, const std::string& dir) {
    save_model(std::static_pointer_cast<torch::nn::Module>(model.ptr()), dir);
  }

  // Loads pretrained weights into a prepared model (the first one, or
  // `model`), like Accelerate's load_checkpoint_in_model: `path` is a
  // safetensors file, a Hugging Face index (model.safetensors.index.json)
  // or a directory holding either, such as what save_model() or `tandem
  // checkpoint merge` wrote. Under ZeRO (once the model's optimizer is
  // prepared) each rank reads only its shard of every sharded parameter
  // (load_safetensors_into_shards, tandem/zero/zero_weights.h); otherwise
  // every rank loads the whole model (load_safetensors), and fp32 master
  // copies of bf16/fp16 parameters are read from the file too. Names,
  // prefix, strict and dtype rules are load_safetensors'; a refusal throws
  // on every rank before anything is copied. Optimizer state is kept. Call
  // between steps. Collective.
  LoadSafetensorsResult load_model_weights(const std::string& path,
                                           const LoadSafetensorsOptions& options = {});
  LoadSafetensorsResult load_model_weights(const std::shared_ptr<torch::nn::Module>& model,
                                           const std::string& path,
                                           const LoadSafetensorsOptions& options = {});
  template <typename ModuleImpl>
  LoadSafetensorsResult load_model_weights(const torch::nn::ModuleHolder<ModuleImpl>& model,
                                           const std::string& path,
                                           const LoadSafetensorsOptions& options = {}) {
    return load_model_weights(std::static_pointer_cast<torch::nn::Module>(model.ptr()), path,
                              options);
  }

  // Seeds torch's CPU (and CUDA) generators with `seed`, or with
  // seed + process_index when `device_specific` (distinct dropout masks and
  // augmentations per rank, all derived from one seed).
  void set_seed(uint64_t seed, bool device_specific = false);

  // A progress bar drawn on the local main process only (stderr).
  ProgressBar progress_bar(int64_t total, std::string description = "") const;

  // Metrics as JSON lines in `path`, and TensorBoard event files when
  // AcceleratorOptions::log_with asks for them; written by the main process
  // only. log() writes every value to each tracker under its key.
  // `config`, as Accelerate's init_trackers(..., config=...): the run's
  // hyperparameters, stored by the trackers that keep them (TensorBoard's
  // HParams tab, through TensorBoardWriter::add_hparams; the JSON lines
  // hold metrics only).
  void init_trackers(const std::string& path,
                     const std::map<std::string, HParamValue>& config = {});
  void log(const std::map<std::string, double>& values, int64_t step);
  // DeepSpeed's wall_clock_breakdown (the config key, or
  // AcceleratorOptions::wall_clock_breakdown): this rank's averages over the
  // last window of steps_per_print optimizer steps, which also go to the
  // trackers (tandem/accelerate/wall_clock.h says what each covers). Zeros
  // before the first window closes, and when the breakdown is off.
  WallClockBreakdown wall_clock() const;

  // Profiles the block the returned session covers with LibTorch's
  // profiler (Kineto: CPU operators, CUDA kernels when training on CUDA)
  // and writes a Chrome trace per rank, OUTPUT_TRACE_DIR/profile_<rank>.json
  // (Accelerate's profile() with ProfileKwargs(output_trace_dir=...)), open
  // it in chrome://tracing or Perfetto. tandem's collectives appear as
  // "tandem::<collective>" (tandem::all_reduce, tandem::broadcast, ...) and
  // DDP's bucket reductions as "tandem::bucket <b>" (launch) and
  // "tandem::bucket <b> wait". Collective: begins and ends with a barrier;
  // call stop() (or let the session go out of scope) on every rank.
  //   tandem::ProfileOptions options;
  //   options.output_trace_dir = "traces";
  //   { auto profile = accelerator.profile(options); train_step(); }
  // See tandem/accelerate/profiler.h for what ranks as threads share.
  [[nodiscard]] ProfileSession profile(const ProfileOptions& options);

  // Flushes trackers and waits for every rank.
  void end_training();

 private:
  friend class LocalSGD;
  // LocalSGD (local_sgd.cpp): every rank's trainable parameters of model
  // `index`, and the fp32 masters of the optimizers over them, replaced by
  // their mean across ranks. Collective.
  void average_parameters(std::size_t index);
  // One prepared model: how it is held across ranks, the optimizers
  // prepared over it (indices into optimizers_; under ZeRO at most one), and
  // the prefix of its tensors' checkpoint names.
  struct PreparedModel {
    std::shared_ptr<torch::nn::Module> module;
    std::shared_ptr<detail::ModelStrategy> strategy;  // shared with no_sync guards
    std::vector<std::size_t> optimizers;
    std::string prefix;
  };
  template <typename ModuleImpl>
  static std::shared_ptr<torch::nn::Module> module_of(
      const torch::nn::ModuleHolder<ModuleImpl>& model) {
    return std::static_pointer_cast<torch::nn::Module>(model.ptr());
  }
  template <typename ModuleImpl>
  static std::shared_ptr<torch::nn::Module> module_of(const std::shared_ptr<ModuleImpl>& model) {
    return std::static_pointer_cast<torch::nn::Module>(model);
  }
  // The index of the prepared `model`; UsageError naming `caller` otherwise.
  std::size_t check_prepared(const std::shared_ptr<torch::nn::Module>& model,
                             const char* caller) const;
  // The prepared optimizer `caller` acts on when none is named.
  AcceleratedOptimizer& only_optimizer(const char* caller) const;
  void check_models_synchronised();
  NoSyncGuard no_sync_at(std::size_t index);
  // Custom objects and pre-hooks in save_state/load_state
  // (accelerator_state_hooks.cpp).
  void run_state_pre_hooks(bool save, const std::string& dir);
  nlohmann::json custom_state_meta(std::vector<std::pair<std::string, at::Tensor>>* tensors);
  void check_custom_states(const CheckpointReader& checkpoint) const;
  void restore_custom_states(const CheckpointReader& checkpoint);
  void save_model_at(std::size_t index, const std::string& dir);
  LoadSafetensorsResult load_model_weights_at(std::size_t index, const std::string& path,
                                              const LoadSafetensorsOptions& options);
  void init_state(const AcceleratorOptions& options);
  DistributedLoaderOptions data_options(DistributedLoaderOptions options) const;
  std::shared_ptr<PreparedLoader> wrap_loader(DistributedLoader loader);
  void install_shadow_hooks();
  double join_gradient_weight();
  void resolve(int64_t micro_batch);
  // Checkpoints (accelerator_checkpoint.cpp).
  // Every prepared model's parameters (and the optimizers' fp32 masters) by
  // checkpoint name, keyed by TensorImpl.
  std::unordered_map<const void*, std::string> tensor_names() const;
  nlohmann::json state_meta(const SaveStateOptions& options);
  std::vector<std::pair<std::string, at::Tensor>> state_tensors();
  // Weights (and, under ZeRO, with `optimizer_states` the optimizer's
  // shards too: they live beside the weights).
  void restore_models(const CheckpointReader& checkpoint, bool optimizer_states);
  void restore_optimizers(const CheckpointReader& checkpoint);
  void restore_progress(const CheckpointReader& checkpoint, const LoadStateOptions& options);

  Config file_config_;
  ConfigEnv env_;
  ConfigOverrides overrides_;
  Config config_;
  std::shared_ptr<ProcessGroup> process_group_;
  int local_rank_ = 0;
  int local_world_size_ = 1;
  c10::Device device_ = c10::Device(c10::kCPU);
  // Decides, once, how every prepared model is held (strategy_factory.h).
  std::shared_ptr<const detail::StrategyFactory> strategies_;
  bool training_data_prepared_ = false;
  std::shared_ptr<detail::StepController> controller_;
  std::vector<PreparedModel> models_;
  std::shared_ptr<LossScaler> scaler_;
  std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers_;
  bool models_checked_ = false;  // check_models_synchronised() ran
  std::shared_ptr<detail::LoaderCursor> train_cursor_;  // the training loader's position
  std::vector<std::shared_ptr<detail::SchedulerCore>> schedulers_;
  // The shadow-step gradient hooks, installed at the first joined backward
  // (accelerator_join.cpp).
  std::unique_ptr<detail::JoinHooks> join_hooks_;
  MetricsLogger metrics_;
  bool log_tensorboard_ = false;
  std::string project_dir_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  bool trigger_ = false;  // set_trigger() since the last check_trigger() that fired
  // register_for_checkpointing() objects, in order, and the state pre-hooks.
  std::vector<std::shared_ptr<Checkpointable>> custom_objects_;
  std::shared_ptr<detail::StateHooks> state_hooks_;
  // wall_clock_breakdown / steps_per_print; null when both are off.
  std::shared_ptr<detail::WallClockTimer> step_timer_;
};

}  // namespace tandem
