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
// prepare() holds each model for its strategy (DDP, ZeRO 1-3, HSDP), shards
// the data, and returns an optimizer and loader that follow the accumulation
// rules (prepared.h). docs/accelerator.md has each method's full contract.
// Collective methods (prepare, gather, save_state, ...) must be called by
// every rank in the same order. One training thread. What prepare() returns
// shares what it wraps: destroy things in any order.

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
#include "tandem/accelerate/csv_writer.h"
#include "tandem/accelerate/mlflow_writer.h"
#include "tandem/accelerate/tensorboard_writer.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/accelerate/prepared_streaming.h"
#include "tandem/accelerate/profiler.h"
#include "tandem/accelerate/progress_bar.h"
#include "tandem/accelerate/train_step.h"
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

namespace tandem {

namespace detail {
class ModelStrategy;
class StepController;
struct StateHooks;
}  // namespace detail

class LRScheduler;
class LocalSGD;

class Accelerator {
 public:
  // Reads the environment and config, joins the job. UsageError: bad config.
  explicit Accelerator(AcceleratorOptions options = {});
  // Joins through the program's process group and config; no environment
  // (`launcher` stands in for what a launcher would export).
  Accelerator(std::shared_ptr<ProcessGroup> process_group, Config config,
              AcceleratorOptions options = {}, LauncherEnv launcher = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- What the job is -----------------------------------------------------
  // The resolved config (batch triple final once data is prepared).
  const Config& config() const;
  const std::shared_ptr<ProcessGroup>& process_group() const;
  c10::Device device() const;
  MixedPrecision mixed_precision() const;
  int64_t gradient_accumulation_steps() const;
  int process_index() const;        // global rank
  int local_process_index() const;  // rank on this node
  int num_processes() const;        // world size
  bool is_main_process() const { return process_index() == 0; }
  bool is_local_main_process() const { return local_process_index() == 0; }

  // ---- prepare -------------------------------------------------------------
  // Moves `model` to the device and holds it for the strategy; the same
  // object comes back. Once per model; any number of models.
  template <typename ModuleImpl>
  torch::nn::ModuleHolder<ModuleImpl> prepare_model(
      const torch::nn::ModuleHolder<ModuleImpl>& model) {
    prepare_model(std::static_pointer_cast<torch::nn::Module>(model.ptr()));
    return model;
  }
  std::shared_ptr<torch::nn::Module> prepare_model(std::shared_ptr<torch::nn::Module> model);
  // Build the model inside this guard: under ZeRO-3 with zero3_init it cuts
  // units to this rank's shard as they are built (tandem/zero/init.h).
  [[nodiscard]] zero::Init zero_init() const;
  // Takes over `optimizer` (stepping the original is refused) with the
  // micro-step, loss-scaling and clipping rules. After prepare_model().
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer(
      std::shared_ptr<torch::optim::Optimizer> optimizer);
  // The config's `optimizer` block over the prepared model (or `model`).
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer_from_config(double default_lr = 0.0);
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer_from_config(
      const std::shared_ptr<torch::nn::Module>& model, double default_lr = 0.0);
  // Steps `scheduler` once per real step of its optimizer.
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(std::shared_ptr<LRScheduler> scheduler);
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(
      std::shared_ptr<torch::optim::LRScheduler> scheduler,
      std::shared_ptr<AcceleratedOptimizer> optimizer = nullptr);
  // The config's `scheduler` block over `optimizer`, "auto" values filled as
  // Accelerate fills them for DummyScheduler(optimizer, total_num_steps,
  // warmup_num_steps): warmup_min_lr 0, warmup_max_lr/cycle_max_lr the
  // optimizer's lr, warmup_num_steps max(1, warmup_num_steps), and
  // total_num_steps (0: not known, so an "auto" one is an error).
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler_from_config(
      const std::shared_ptr<AcceleratedOptimizer>& optimizer, int64_t total_num_steps = 0,
      int64_t warmup_num_steps = 0);
  // Shards tensors, a fetch function or a dataset across ranks; the first
  // loader prepared is the training data (its batch completes the config).
  std::shared_ptr<PreparedLoader> prepare_data_loader(std::vector<at::Tensor> tensors,
                                                      DistributedLoaderOptions options);
  std::shared_ptr<PreparedLoader> prepare_data_loader(std::vector<at::Tensor> tensors,
                                                      int64_t batch_size);
  std::shared_ptr<PreparedLoader> prepare_data_loader(DistributedLoader::Fetch fetch,
                                                      int64_t dataset_size,
                                                      DistributedLoaderOptions options);
  // A dataset with size() and get(i) returning Example<>: stacked batches.
  template <typename Dataset>
  auto prepare_data_loader(Dataset dataset, DistributedLoaderOptions options) {
    using ExampleType = decltype(dataset.get(size_t{0}));
    using Target = typename ExampleType::TargetType;
    auto [fetch, size] = detail::dataset_fetch(std::move(dataset));
    return std::make_shared<ExampleLoader<Target>>(
        prepare_data_loader(std::move(fetch), size, options));
  }
  template <typename Dataset>
  auto prepare_data_loader(Dataset dataset, int64_t batch_size) {
    DistributedLoaderOptions options;
    options.batch_size = batch_size;
    return prepare_data_loader(std::move(dataset), options);
  }
  // Wraps a loader built in code as it is, without resharding.
  std::shared_ptr<PreparedLoader> prepare_local_loader(DistributedLoader loader);
  // An iterable (streaming) dataset, as Accelerate prepares a DataLoader over
  // an IterableDataset: a StreamingLoader over this job's processes whose
  // batches go to the training device, whose last batch of a pass syncs
  // gradients, and whose position save_state keeps when it is the first
  // loader prepared (tandem/accelerate/prepared_streaming.h).
  std::shared_ptr<PreparedStreamingLoader> prepare_streaming_loader(
      StreamFactory factory, StreamingLoaderOptions options = {},
      StreamingLoader::Collate collate = stack_collate);
  // Model, optimizer, data (, scheduler): {optimizer, loader(, scheduler)}.
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
  // Autocast for forward and loss, per mixed_precision (amp/autocast.h).
  AutocastGuard autocast() const;
  // Scaled, accumulation-divided fp32 loss.backward(); outside accumulate()
  // it begins a micro-step. `loss` must be a scalar.
  void backward(const at::Tensor& loss);
  // RAII guard for one micro-step: gradients are synchronised only on
  // accumulation boundaries and on the last batch of a pass.
  class AccumulateGuard;  // accelerator_guards.h
  // One micro-step for every backward inside; the models are prepared ones.
  template <typename... Models>
  [[nodiscard]] AccumulateGuard accumulate(const Models&... models);
  // One micro-step as a callable: `loss` under autocast, backward, clipping
  // and the optimizer step; with cuda_graph enabled the whole step is
  // captured as CUDA graphs and replayed (tandem/accelerate/train_step.h).
  TrainStep train_step(std::shared_ptr<AcceleratedOptimizer> optimizer, LossFunction loss);
  bool sync_gradients() const;  // this micro-step synchronises gradients
  int64_t step() const;         // real optimizer steps so far
  // Accelerate's optimizer_step_was_skipped: whether any prepared
  // optimizer's last synchronising step() was skipped because the loss
  // scaler found inf/NaN gradients. Unlike AcceleratedOptimizer::
  // step_was_skipped(), micro-steps that only accumulate do not change it.
  bool optimizer_step_was_skipped() const;
  // Clips to a global norm (unscaled first); returns the norm before, NaN
  // on a non-syncing micro-step, inf on overflow.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  double clip_grad_norm(const std::shared_ptr<AcceleratedOptimizer>& optimizer, double max_norm,
                        double norm_type = 2.0);
  // Clamps every prepared optimizer's gradients to [-clip_value, clip_value].
  void clip_grad_value(double clip_value);
  // No gradient communication for one prepared model while the guard lives
  // (nestable; UsageError under ZeRO 2 and 3). Call outside backward.
  class NoSyncGuard;  // accelerator_guards.h
  template <typename Model>
  [[nodiscard]] NoSyncGuard no_sync(const Model& model);
  // The next backward's loss scale, and the steps skipped on overflow.
  double loss_scale() const;
  int64_t skipped_steps() const;
  LossScaler& loss_scaler() const;

  // ---- Uneven inputs (Join) ------------------------------------------------
  // Passes that start while the guard lives are joined: ranks out of data
  // take shadow steps (zero gradient) until all are. One guard at a time.
  class JoinGuard;  // accelerator_guards.h
  [[nodiscard]] JoinGuard join_uneven_inputs();
  bool is_shadow_batch() const;     // this rank's batch is a shadow one
  int64_t ranks_with_data() const;  // ranks with a real batch this step
  GradientState gradient_state() const;  // a snapshot

  // ---- Helpers -------------------------------------------------------------
  // Prints on the main process only.
  template <typename... Args>
  void print(fmt::format_string<Args...> f, Args&&... args) const {
    if (is_main_process()) print_line(fmt::format(f, std::forward<Args>(args)...));
  }
  void print_line(const std::string& line) const;
  void wait_for_everyone();  // barrier
  // `fn` on the main (local main) process first, then on the others.
  void main_process_first(const std::function<void()>& fn);
  void local_main_process_first(const std::function<void()>& fn);
  // Every rank's `tensor` concatenated along dim 0 (uneven dim 0 is fine).
  at::Tensor gather(const at::Tensor& tensor);
  // gather() without even batches' duplicates and shadow batches' rows.
  at::Tensor gather_for_metrics(const at::Tensor& tensor);
  at::Tensor reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Pads `tensor` along `dim` to the largest size any rank has.
  at::Tensor pad_across_processes(const at::Tensor& tensor, int64_t dim = 0,
                                  double pad_index = 0, bool pad_first = false);
  // Objects across ranks (tandem/comm/objects.h). Collectives.
  template <typename T>
  auto gather_object(const T& object) {
    return tandem::gather_object(*process_group(), object);
  }
  template <typename T>
  void broadcast_object(T& object, int src = 0) {
    tandem::broadcast_object(*process_group(), object, src);
  }
  // This process's contiguous share of `items`. Not a collective.
  template <typename Items>
  auto split_between_processes(const Items& items, bool apply_padding = false) const {
    return tandem::split_between_processes(items, process_index(), num_processes(),
                                           apply_padding);
  }
  // set_trigger() is local; check_trigger() (collective) is true everywhere
  // when any rank set it since the last true, and clears it.
  void set_trigger();
  bool check_trigger();
  // Drops everything prepared, step count back to 0. Between steps.
  void free_memory();
  // fn(batch_size), and after an OOM on any rank fn(reduce(batch_size)):
  // by default int(batch_size * 0.9), as Accelerate's. Collective.
  int64_t find_executable_batch_size(const std::function<void(int64_t)>& fn,
                                     int64_t starting_batch_size,
                                     const std::function<int64_t(int64_t)>& reduce = {});
  // The bare first prepared model (null before any).
  std::shared_ptr<torch::nn::Module> unwrap_model() const;
  // The ZeroOptimizer sharding the first model (or `model`), else nullptr.
  std::shared_ptr<ZeroOptimizer> zero_optimizer() const;
  std::shared_ptr<ZeroOptimizer> zero_optimizer(const std::shared_ptr<torch::nn::Module>& model) const;
  // Whole parameters and buffers on the CPU. Collective.
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict() const;
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict(
      const std::shared_ptr<torch::nn::Module>& model) const;

  // ---- Checkpoints ---------------------------------------------------------
  // Everything to resume exactly, as DIR/<tag>, atomically. Collective.
  void save_state(const std::string& dir, const SaveStateOptions& options = {});
  // With automatic_checkpoint_naming: project_dir/checkpoints, tag
  // checkpoint_<iteration> (UsageError if it exists), then iteration + 1.
  void save_state();
  // With automatic_checkpoint_naming: the highest checkpoint_<N> under
  // project_dir/checkpoints; the next save_state() writes checkpoint_<N + 1>.
  nlohmann::json load_state();
  // The `iteration` the next automatically named save_state() writes.
  int64_t save_iteration() const;
  // Restores a checkpoint into the prepared objects; returns client state.
  // The run counts as resumed at step(): init_trackers()' JSON lines file
  // (before or after this call) keeps its lines up to that step.
  nlohmann::json load_state(const std::string& dir, const LoadStateOptions& options = {});
  // Saved and restored with the checkpoint as custom_checkpoint_<i>.
  void register_for_checkpointing(std::shared_ptr<Checkpointable> object);
  void register_for_checkpointing(std::function<CustomState()> state_dict,
                                  std::function<void(const CustomState&)> load_state_dict);
  // Run first by save_state()/load_state(), in registration order.
  using StatePreHook = std::function<void(
      const std::vector<std::shared_ptr<torch::nn::Module>>& models, const std::string& dir)>;
  // Removes its hook (again, or after the Accelerator: nothing).
  class HookHandle;  // accelerator_guards.h
  HookHandle register_save_state_pre_hook(StatePreHook hook);
  HookHandle register_load_state_pre_hook(StatePreHook hook);
  // With the preemption block (docs/slurm.md): a step boundary for a loop
  // without a prepared loader (a prepared loader makes its own). After a
  // signal on any rank, every rank saves here at the same step and the
  // process exits with kPreemptedExitCode. Collective: once per step.
  void preemption_point();
  // True when DIR holds a committed checkpoint load_state(dir) would load.
  static bool has_checkpoint(const std::string& dir);
  // Consolidated weights, from rank 0, as Accelerate's save_model: one
  // DIR/model.safetensors, or, when they exceed `max_shard_size` (Hugging
  // Face's spelling: "10GB", "500MB", "2GiB", bytes), consecutive shards
  // DIR/model-0000K-of-0000N.safetensors of at most that size each (a tensor
  // larger than it alone in its own) with DIR/model.safetensors.index.json.
  // Weights an earlier save_model left in DIR that a loader would read
  // instead are removed. UsageError for a size it cannot read. Collective.
  void save_model(const std::string& dir, const std::string& max_shard_size = "10GB");
  void save_model(const std::shared_ptr<torch::nn::Module>& model, const std::string& dir,
                  const std::string& max_shard_size = "10GB");
  template <typename ModuleImpl>
  void save_model(const torch::nn::ModuleHolder<ModuleImpl>& model, const std::string& dir,
                  const std::string& max_shard_size = "10GB") {
    save_model(std::static_pointer_cast<torch::nn::Module>(model.ptr()), dir, max_shard_size);
  }
  // Pretrained safetensors weights into a prepared model. Collective.
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

  // ---- Seeding, trackers, timing -------------------------------------------
  // Seeds torch's generators (+ process_index when `device_specific`).
  void set_seed(uint64_t seed, bool device_specific = false);
  // A progress bar drawn on the local main process only (stderr).
  ProgressBar progress_bar(int64_t total, std::string description = "") const;
  // Metrics as JSON lines in `path` (TensorBoard, CSV, MLflow with
  // log_with; MLflow's experiment is `path`'s stem unless named). A new
  // run starts `path` over; after load_state() it keeps the lines up to
  // the resumed step (MetricsLogger::resume_from). A DeepSpeed monitor
  // writing to log_with's folder shares its writer (each value once).
  void init_trackers(const std::string& path,
                     const std::map<std::string, HParamValue>& config = {});
  // `values` at `step` to every tracker. UsageError for a key "step" or
  // "time" (fields of each JSON line).
  void log(const std::map<std::string, double>& values, int64_t step);
  // Accelerate's get_tracker(name, unwrap=True): init_trackers()'s writer,
  // TensorBoardWriter for "tensorboard", CsvWriter for "csv" or MlflowWriter
  // for "mlflow", for what log() does not write (text, hparams, tags). Null off the main process; UsageError on
  // it for a tracker log_with did not ask for or before init_trackers().
  template <typename Writer>
  Writer* get_tracker(const std::string& name) const;
  // wall_clock_breakdown: the last window's averages (zeros before it).
  WallClockBreakdown wall_clock() const;
  // A Chrome trace per rank of the session's scope. Collective.
  [[nodiscard]] ProfileSession profile(const ProfileOptions& options);
  // Flushes trackers and waits for every rank.
  void end_training();

 private:
  friend class LocalSGD;
  friend class TrainStep;
  struct Impl;
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
  AccumulateGuard begin_accumulate();
  NoSyncGuard no_sync_at(std::size_t index);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

#include "tandem/accelerate/accelerator_guards.h"
