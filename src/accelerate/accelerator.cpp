// Accelerator: construction and the job's configuration, and the methods
// that forward to its parts (accelerator_impl.h). Stepping is in
// accelerator_step.cpp, preparing models, optimizers and schedulers in
// accelerator_prepare.cpp, the collective helpers in
// accelerator_collectives.cpp.

#include "tandem/accelerate/accelerator.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>

#include <torch/cuda.h>
#include <torch/utils.h>

#include "accelerate/accelerator_impl.h"
#include "accelerate/consistency_check.h"
#include "accelerate/step_controller.h"
#include "tandem/amp/cpu_bf16.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/logging.h"

namespace tandem {

Accelerator::Impl::Impl(Config file_config_in, ConfigEnv env_in,
                        std::shared_ptr<ProcessGroup> group_in, int local_rank_in,
                        int local_world_size_in, const AcceleratorOptions& options)
    : file_config(std::move(file_config_in)),
      env(std::move(env_in)),
      group(std::move(group_in)),
      local_rank(local_rank_in),
      local_world_size(local_world_size_in),
      split_batches(options.split_batches),
      dispatch_batches(options.dispatch_batches),
      step_scheduler_with_optimizer(options.step_scheduler_with_optimizer),
      project_dir(options.project_dir),
      automatic_checkpoint_naming(options.automatic_checkpoint_naming),
      total_limit(options.total_limit),
      iteration(options.iteration),
      save_on_each_node(options.save_on_each_node) {
  TANDEM_CHECK_ARG(options.total_limit >= 0 && options.iteration >= 0,
                   "AcceleratorOptions: total_limit ({}) and iteration ({}) must be >= 0",
                   options.total_limit, options.iteration);
  prepared.controller()->set_sync_rules(options.sync_with_dataloader, options.sync_each_batch);
  detail::Trackers::Settings tracking;
  tracking.log_with = options.log_with;
  tracking.project_dir = options.project_dir;
  tracking.mlflow = options.mlflow;
  tracking.main_process = main_process();
  tracking.local_main_process = local_rank == 0;
  trackers = std::make_unique<detail::Trackers>(std::move(tracking));
  overrides.mixed_precision = options.mixed_precision;
  overrides.gradient_accumulation_steps = options.gradient_accumulation_steps;
  overrides.gradient_clipping = options.gradient_clipping;
  overrides.wall_clock_breakdown = options.wall_clock_breakdown;
  overrides.steps_per_print = options.steps_per_print;
  overrides.cuda_graph = options.cuda_graph;
  overrides.preemption = options.preemption;
  // "auto" ZeRO sizes, from the hidden size as Accelerate fills them.
  // The file's own warnings, which `tandem launch` printed already when it
  // says it did (for this file).
  std::vector<std::string> shown_by_launcher;
  if (const char* shown = std::getenv("TANDEM_CONFIG_WARNINGS_SHOWN");
      shown != nullptr && !file_config.source_path.empty() && file_config.source_path == shown) {
    shown_by_launcher = file_config.warnings;
  }
  if (options.hidden_size) fill_hidden_size_auto(file_config, *options.hidden_size);
  resolve(0);
  detail::check_config_consistency(*group, config);
  // Every rank, in the same order: HSDP's split of the world is collective.
  strategies =
      std::make_unique<const detail::StrategyFactory>(config, options.ddp, group, local_world_size,
                                                      options.zero_shard_optimizer_factory,
                                                      options.zero_auto_wrap);
  if (main_process()) {
    for (const auto& warning : config.warnings) {
      if (std::find(shown_by_launcher.begin(), shown_by_launcher.end(), warning) ==
          shown_by_launcher.end()) {
        log_warn("{}", warning);
      }
    }
    strategies->warn_about_config(config);
  }
  const bool want_cuda = !options.cpu && !config.use_cpu;
  if (want_cuda && torch::cuda::is_available()) {
    const int devices = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % devices));
  } else if (config.distributed_type == DistributedType::kMultiGpu && want_cuda &&
             main_process()) {
    log_warn("the config asks for MULTI_GPU but CUDA is not available here; training on the CPU");
  }
  // DeepSpeed's torch_autocast without a dtype: torch.autocast's default
  // for CUDA is fp16 (the file was read as bf16, the CPU's).
  if (file_config.autocast_device_default && device.is_cuda()) {
    file_config.mixed_precision = MixedPrecision::kFp16;
    resolve(0);
  }
  TANDEM_CHECK_ARG(config.mixed_precision != MixedPrecision::kFp16 || device.is_cuda(),
                   "Accelerator: mixed_precision fp16 needs a CUDA device, and this run trains "
                   "on the CPU. Use bf16 on the CPU (mixed_precision: bf16, or "
                   "--mixed-precision bf16), or no");
  // bf16 on a CPU that emulates it trains correctly but tens of times slower
  // than fp32; say so once, with the factor measured here and the remedy.
  if (config.mixed_precision == MixedPrecision::kBf16 && !device.is_cuda() && main_process()) {
    const CpuBf16Support bf16 = cpu_bf16_support(/*measure=*/true);
    if (!bf16.native) log_warn("{}", cpu_bf16_warning(bf16));
  }
  scaler = options.loss_scaling ? make_loss_scaler(*options.loss_scaling, MixedPrecision::kFp16)
                                : make_loss_scaler(config.fp16, config.mixed_precision);
  if (config.seed) torch::manual_seed(*config.seed);
  // The DeepSpeed monitors count samples: steps x the global batch, once
  // the loader has completed the batch triple.
  trackers->start_timer(config, device, [this] { return config.train_batch_size.value_or(1); });
  data = std::make_unique<detail::DataPreparation>(
      group, device, prepared, [this](int64_t micro_batch) { resolve(micro_batch); },
      detail::DataPreparation::Sharding{split_batches, dispatch_batches.value_or(false)});
  checkpointer = std::make_unique<detail::Checkpointer>(group, config, scaler, prepared, *data,
                                                        save_on_each_node);
  if (config.preemption.enabled) {
    preemption = std::make_unique<detail::Preemption>(config.preemption, group);
    prepared.controller()->set_boundary_hook([this] { preemption_boundary(); });
  }
}

void Accelerator::Impl::resolve(int64_t micro_batch) {
  if (micro_batch > 0) {
    // The program's loader and the config must agree on the per-process
    // batch; one given in only one place is used.
    const std::optional<int64_t>& file_micro = file_config.train_micro_batch_size_per_gpu;
    if (file_micro && *file_micro != micro_batch) {
      auto where = file_config.key_locations.find("train_micro_batch_size_per_gpu");
      TANDEM_THROW(UsageError,
                   "train_micro_batch_size_per_gpu {} (from {}) disagrees with the data loader's "
                   "batch size {} (the program's prepare_data_loader): each process would train "
                   "on {}, not on {}. Make them agree: change one, or set the config's value to "
                   "\"auto\" so the loader decides",
                   *file_micro,
                   where != file_config.key_locations.end() ? where->second
                   : file_config.source_path.empty()         ? std::string("the config")
                                                             : file_config.source_path,
                   micro_batch, micro_batch, *file_micro);
    }
    overrides.train_micro_batch_size_per_gpu = micro_batch;
    overrides.train_micro_batch_size_source = "the data loader's batch size";
  }
  config = resolve_config(file_config, env, overrides, group->world_size());
  prepared.controller()->set_accumulation_steps(config.gradient_accumulation_steps.value_or(1));
}

Accelerator::Accelerator(AcceleratorOptions options) {
  const RankEnv rank_env = RankEnv::from_environment();
  ConfigEnv env = ConfigEnv::from_environment();
  const std::string& path = options.config_file.empty() ? env.config_file : options.config_file;
  Config file_config;
  if (!path.empty()) file_config = load_config_file(path);
  // A bad config fails on every rank before anyone joins, so nobody hangs.
  std::shared_ptr<ProcessGroup> group = ProcessGroup::init(rank_env, options.process_group);
  impl_ = std::make_unique<Impl>(std::move(file_config), std::move(env), std::move(group),
                                 rank_env.local_rank, rank_env.local_world_size, options);
}

Accelerator::Accelerator(std::shared_ptr<ProcessGroup> process_group, Config config,
                         AcceleratorOptions options, LauncherEnv launcher) {
  TANDEM_CHECK_ARG(process_group != nullptr, "Accelerator: the process group is null");
  const int local_rank = launcher.local_rank >= 0 ? launcher.local_rank : process_group->rank();
  const int local_world_size =
      launcher.local_world_size > 0 ? launcher.local_world_size : process_group->world_size();
  impl_ = std::make_unique<Impl>(std::move(config), std::move(launcher.config),
                                 std::move(process_group), local_rank, local_world_size, options);
}

// The prepared objects share what they need (the controller, the DDP
// wrapper, the ZeRO optimizer, the step timer, which stops reporting here).
Accelerator::~Accelerator() {
  // Prepared loaders may outlive the Accelerator: their boundary reaches
  // nothing from now on.
  if (impl_ && impl_->preemption) impl_->prepared.controller()->set_boundary_hook({});
}

const Config& Accelerator::config() const { return impl_->config; }
const std::shared_ptr<ProcessGroup>& Accelerator::process_group() const { return impl_->group; }
c10::Device Accelerator::device() const { return impl_->device; }
MixedPrecision Accelerator::mixed_precision() const { return impl_->config.mixed_precision; }
int Accelerator::process_index() const { return impl_->group->rank(); }
int Accelerator::local_process_index() const { return impl_->local_rank; }
int Accelerator::num_processes() const { return impl_->group->world_size(); }

std::size_t Accelerator::check_prepared(const std::shared_ptr<torch::nn::Module>& model,
                                        const char* caller) const {
  return impl_->index_of(model, caller);
}

zero::Init Accelerator::zero_init() const { return impl_->strategies->zero_init(impl_->device); }

// ---- Data (DataPreparation) --------------------------------------------------

std::shared_ptr<PreparedLoader> Accelerator::prepare_data_loader(std::vector<at::Tensor> tensors,
                                                                 DistributedLoaderOptions options) {
  return impl_->data->prepare(std::move(tensors), options);
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_data_loader(std::vector<at::Tensor> tensors,
                                                                 int64_t batch_size) {
  DistributedLoaderOptions options;
  options.batch_size = batch_size;
  return impl_->data->prepare(std::move(tensors), options);
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_data_loader(DistributedLoader::Fetch fetch,
                                                                 int64_t dataset_size,
                                                                 DistributedLoaderOptions options) {
  return impl_->data->prepare(std::move(fetch), dataset_size, options);
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_local_loader(DistributedLoader loader) {
  return impl_->data->wrap(std::move(loader));
}

std::shared_ptr<PreparedStreamingLoader> Accelerator::prepare_streaming_loader(
    StreamFactory factory, StreamingLoaderOptions options, StreamingLoader::Collate collate) {
  return impl_->data->prepare_streaming(std::move(factory), std::move(options),
                                        std::move(collate));
}

// ---- Checkpoints (Checkpointer) ----------------------------------------------

bool Accelerator::has_checkpoint(const std::string& dir) {
  return detail::Checkpointer::has_checkpoint(dir);
}

void Accelerator::save_state(const std::string& dir, const SaveStateOptions& options) {
  impl_->checkpointer->save_state(dir, options);
}

nlohmann::json Accelerator::load_state(const std::string& dir, const LoadStateOptions& options) {
  nlohmann::json client_state = impl_->checkpointer->load_state(dir, options);
  // The JSON lines keep the earlier run's history up to here.
  impl_->trackers->resumed(step());
  return client_state;
}

std::string Accelerator::Impl::automatic_checkpoint_dir(const char* caller) const {
  TANDEM_CHECK_ARG(automatic_checkpoint_naming && !project_dir.empty(),
                   "Accelerator::{} without a directory names checkpoints automatically, "
                   "which needs AcceleratorOptions::automatic_checkpoint_naming and "
                   "project_dir (Accelerate's ProjectConfiguration); or pass a directory",
                   caller);
  return project_dir + "/checkpoints";
}

void Accelerator::save_state() {
  Impl& s = *impl_;
  const std::string dir = s.automatic_checkpoint_dir("save_state()");
  SaveStateOptions options;
  options.tag = fmt::format("checkpoint_{}", s.iteration);
  options.total_limit = s.total_limit;
  TANDEM_CHECK_ARG(!fs::is_directory(dir + "/" + options.tag),
                   "Accelerator::save_state(): {}/{} already exists; set "
                   "AcceleratorOptions::iteration to the next free number, or load_state() "
                   "first (it continues after the checkpoint it loads)",
                   dir, options.tag);
  save_state(dir, options);
  ++s.iteration;
}

nlohmann::json Accelerator::load_state() {
  Impl& s = *impl_;
  const std::string dir = s.automatic_checkpoint_dir("load_state()");
  // As Accelerate: the highest checkpoint_<N>, whatever `latest` says.
  int64_t newest = -1;
  for (const std::string& tag : checkpoint_tags(dir)) {
    if (tag.rfind("checkpoint_", 0) != 0) continue;
    const std::string number = tag.substr(11);
    if (number.empty() || number.find_first_not_of("0123456789") != std::string::npos) continue;
    newest = std::max<int64_t>(newest, std::stoll(number));
  }
  TANDEM_CHECK_ARG(newest >= 0, "Accelerator::load_state(): {} holds no checkpoint_<N>; save "
                                "one with save_state() first",
                   dir);
  LoadStateOptions options;
  options.tag = fmt::format("checkpoint_{}", newest);
  nlohmann::json client_state = load_state(dir, options);
  s.iteration = newest + 1;
  return client_state;
}

int64_t Accelerator::save_iteration() const { return impl_->iteration; }

void Accelerator::register_for_checkpointing(std::shared_ptr<Checkpointable> object) {
  impl_->checkpointer->register_object(std::move(object));
}

void Accelerator::register_for_checkpointing(
    std::function<CustomState()> state_dict,
    std::function<void(const CustomState&)> load_state_dict) {
  impl_->checkpointer->register_object(
      detail::function_checkpointable(std::move(state_dict), std::move(load_state_dict)));
}

Accelerator::HookHandle Accelerator::register_save_state_pre_hook(StatePreHook hook) {
  return HookHandle(impl_->checkpointer->hooks(), true,
                    impl_->checkpointer->register_pre_hook(true, std::move(hook)));
}

Accelerator::HookHandle Accelerator::register_load_state_pre_hook(StatePreHook hook) {
  return HookHandle(impl_->checkpointer->hooks(), false,
                    impl_->checkpointer->register_pre_hook(false, std::move(hook)));
}

void Accelerator::HookHandle::remove() {
  const std::shared_ptr<detail::StateHooks> hooks = hooks_.lock();
  if (hooks) (save_ ? hooks->save : hooks->load).erase(id_);
}

void Accelerator::save_model(const std::string& dir, const std::string& max_shard_size) {
  TANDEM_CHECK_ARG(!impl_->prepared.models().empty(), "save_model: prepare the model first");
  impl_->checkpointer->save_model(0, dir, max_shard_size);
}

void Accelerator::save_model(const std::shared_ptr<torch::nn::Module>& model,
                             const std::string& dir, const std::string& max_shard_size) {
  impl_->checkpointer->save_model(impl_->index_of(model, "save_model"), dir, max_shard_size);
}

LoadSafetensorsResult Accelerator::load_model_weights(const std::string& path,
                                                      const LoadSafetensorsOptions& options) {
  TANDEM_CHECK_ARG(!impl_->prepared.models().empty(),
                   "load_model_weights: prepare the model first");
  return impl_->checkpointer->load_model_weights(0, path, options);
}

LoadSafetensorsResult Accelerator::load_model_weights(
    const std::shared_ptr<torch::nn::Module>& model, const std::string& path,
    const LoadSafetensorsOptions& options) {
  return impl_->checkpointer->load_model_weights(impl_->index_of(model, "load_model_weights"),
                                                 path, options);
}

// ---- Trackers and timing (Trackers) ------------------------------------------

ProgressBar Accelerator::progress_bar(int64_t total, std::string description) const {
  return impl_->trackers->progress_bar(total, std::move(description));
}

void Accelerator::init_trackers(const std::string& path,
                                const std::map<std::string, HParamValue>& config) {
  impl_->trackers->init(path, config);
}

void Accelerator::log(const std::map<std::string, double>& values, int64_t step) {
  impl_->trackers->log(values, step);
}

namespace {

template <typename Writer>
Writer* tracker_writer(Writer* writer, const std::string& name, const char* expected,
                       bool main_process) {
  TANDEM_CHECK_ARG(name == expected,
                   "Accelerator::get_tracker: '{}' is not this writer's tracker; ask for "
                   "get_tracker<TensorBoardWriter>(\"tensorboard\"), "
                   "get_tracker<CsvWriter>(\"csv\") or get_tracker<MlflowWriter>(\"mlflow\")",
                   name);
  TANDEM_CHECK_ARG(writer != nullptr || !main_process,
                   "Accelerator::get_tracker(\"{}\"): there is no such tracker; put \"{}\" in "
                   "AcceleratorOptions::log_with and call init_trackers() first",
                   name, name);
  return writer;
}

}  // namespace

template <>
TensorBoardWriter* Accelerator::get_tracker<TensorBoardWriter>(const std::string& name) const {
  return tracker_writer(impl_->trackers->tensorboard(), name, "tensorboard",
                        impl_->main_process());
}

template <>
CsvWriter* Accelerator::get_tracker<CsvWriter>(const std::string& name) const {
  return tracker_writer(impl_->trackers->csv(), name, "csv", impl_->main_process());
}

template <>
MlflowWriter* Accelerator::get_tracker<MlflowWriter>(const std::string& name) const {
  return tracker_writer(impl_->trackers->mlflow(), name, "mlflow", impl_->main_process());
}

WallClockBreakdown Accelerator::wall_clock() const { return impl_->trackers->wall_clock(); }

void Accelerator::end_training() {
  impl_->trackers->close();
  wait_for_everyone();
}

// ---- Helpers -----------------------------------------------------------------

void Accelerator::print_line(const std::string& line) const {
  if (!is_main_process()) return;
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  const uint64_t value = seed + (device_specific ? static_cast<uint64_t>(process_index()) : 0);
  torch::manual_seed(value);  // CPU and, when present, every CUDA device
}

void Accelerator::set_trigger() { impl_->trigger = true; }

}  // namespace tandem
