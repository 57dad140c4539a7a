// Accelerator: construction, prepare and stepping. The collective helpers
// (gather, reduce, ...) are in accelerator_collectives.cpp.

#include "tandem/accelerate/accelerator.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include "accelerate/consistency_check.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "tandem/amp/autocast.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/optim/optimizer_factory.h"
#include "tandem/core/logging.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {

namespace {

// LibTorch's parameters() lists a tied tensor once per registration, and an
// optimizer built over it steps that tensor once per entry. tandem keeps the
// optimizer as built (so a run matches the same loop without tandem), but
// says so: it is rarely what the author meant.
void warn_if_listed_twice(torch::optim::Optimizer& optimizer, const torch::nn::Module* model,
                          bool zero) {
  std::size_t entries = 0;
  for (auto& group : optimizer.param_groups()) entries += group.params().size();
  const auto unique = unique_optimizer_parameters(optimizer);
  if (unique.size() == entries) return;
  std::string tied = "a tensor";
  if (model != nullptr) {
    for (const auto& p : unique_named_parameters(*model)) {
      if (p.aliases.empty()) continue;
      tied = fmt::format("'{}' (also registered as '{}')", p.name, fmt::join(p.aliases, "', '"));
      break;
    }
  }
  log_warn("prepare_optimizer: {} of the optimizer's entries repeat a tensor it already lists, "
           "e.g. {}; LibTorch's parameters() repeats tied weights. {} Build the optimizer over "
           "tandem::unique_parameters(*model) to step each tensor once, as Python's "
           "model.parameters() would",
           entries - unique.size(), tied,
           zero ? "ZeRO updates each tensor once per step regardless."
                : "LibTorch's optimizers update such a tensor once per entry, each step.");
}

}  // namespace

Accelerator::Accelerator(AcceleratorOptions options) {
  const RankEnv rank_env = RankEnv::from_environment();
  env_ = ConfigEnv::from_environment();
  const std::string& path = options.config_file.empty() ? env_.config_file : options.config_file;
  if (!path.empty()) file_config_ = load_config_file(path);
  local_rank_ = rank_env.local_rank;
  local_world_size_ = rank_env.local_world_size;
  // A bad config fails on every rank before anyone joins, so nobody hangs.
  process_group_ = ProcessGroup::init(rank_env, options.process_group);
  init_state(options);
}

Accelerator::Accelerator(std::shared_ptr<ProcessGroup> process_group, Config config,
                         AcceleratorOptions options, LauncherEnv launcher)
    : file_config_(std::move(config)), env_(std::move(launcher.config)),
      process_group_(std::move(process_group)) {
  TANDEM_CHECK_ARG(process_group_ != nullptr, "Accelerator: the process group is null");
  local_rank_ = launcher.local_rank >= 0 ? launcher.local_rank : process_group_->rank();
  local_world_size_ = launcher.local_world_size > 0 ? launcher.local_world_size
                                                    : process_group_->world_size();
  init_state(options);
}

// The prepared objects share what they need (the controller, the DDP
// wrapper, the ZeRO optimizer); the join hooks hold the controller weakly.
Accelerator::~Accelerator() = default;

void Accelerator::init_state(const AcceleratorOptions& options) {
  for (const auto& tracker : options.log_with) {
    TANDEM_CHECK_ARG(tracker == "tensorboard" || tracker == "all",
                     "Accelerator: log_with '{}' is not available. tandem writes JSON lines "
                     "always and TensorBoard event files with log_with \"tensorboard\" (or "
                     "\"all\"); other trackers can read either",
                     tracker);
    log_tensorboard_ = true;
  }
  project_dir_ = options.project_dir;
  overrides_.mixed_precision = options.mixed_precision;
  overrides_.gradient_accumulation_steps = options.gradient_accumulation_steps;
  overrides_.gradient_clipping = options.gradient_clipping;
  controller_ = std::make_shared<detail::StepController>();
  resolve(0);
  detail::check_config_consistency(*process_group_, config_);
  if (is_main_process()) {
    for (const auto& warning : config_.warnings) log_warn("{}", warning);
  }
  const bool want_cuda = !options.cpu && !config_.use_cpu;
  if (want_cuda && torch::cuda::is_available()) {
    device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(
                                          local_rank_ % std::max<int>(1, torch::cuda::device_count())));
  } else if (config_.distributed_type == DistributedType::kMultiGpu && want_cuda &&
             is_main_process()) {
    log_warn("the config asks for MULTI_GPU but CUDA is not available here; training on the CPU");
  }
  TANDEM_CHECK_ARG(config_.mixed_precision != MixedPrecision::kFp16 || device_.is_cuda(),
                   "Accelerator: mixed_precision fp16 needs a CUDA device, and this run trains "
                   "on the CPU. Use bf16 on the CPU (mixed_precision: bf16, or "
                   "--mixed-precision bf16), or no");
  if (options.loss_scaling) {
    scaler_ = make_loss_scaler(*options.loss_scaling, MixedPrecision::kFp16);
  } else {
    scaler_ = make_loss_scaler(config_.fp16, config_.mixed_precision);
  }
  if (options.ddp) {
    ddp_options_ = options.ddp;
  } else {
    DDPOptions ddp;
    ddp.bucket_cap_mb = config_.ddp.bucket_cap_mb;
    ddp.first_bucket_cap_mb = config_.ddp.first_bucket_cap_mb;
    ddp.find_unused_parameters = config_.ddp.find_unused_parameters;
    ddp.broadcast_buffers = config_.ddp.broadcast_buffers;
    ddp.cache_cpu_allocations = config_.ddp.cache_cpu_allocations;
    ddp.comm_hook = config_.ddp.comm_hook == "bf16"   ? CommHook::kBf16Compress
                    : config_.ddp.comm_hook == "fp16" ? CommHook::kFp16Compress
                                                      : CommHook::kAverage;
    ddp_options_ = ddp;
  }
  if (config_.seed) set_seed(*config_.seed);
}

void Accelerator::resolve(int64_t micro_batch) {
  if (micro_batch > 0) overrides_.train_micro_batch_size_per_gpu = micro_batch;
  config_ = resolve_config(file_config_, env_, overrides_, process_group_->world_size());
  controller_->set_accumulation_steps(config_.gradient_accumulation_steps.value_or(1));
}

int64_t Accelerator::gradient_accumulation_steps() const {
  return controller_->state().accumulation_steps;
}

GradientState Accelerator::gradient_state() const { return controller_->state(); }

bool Accelerator::sync_gradients() const { return controller_->state().sync_gradients; }

int64_t Accelerator::step() const { return controller_->state().optimizer_steps; }

bool Accelerator::is_shadow_batch() const { return controller_->state().shadow_batch; }

int64_t Accelerator::ranks_with_data() const {
  const GradientState& state = controller_->state();
  return state.joining ? state.ranks_with_data : num_processes();
}

int Accelerator::process_index() const { return process_group_->rank(); }
int Accelerator::local_process_index() const { return local_rank_; }
int Accelerator::num_processes() const { return process_group_->world_size(); }

std::shared_ptr<torch::nn::Module> Accelerator::prepare_model(
    std::shared_ptr<torch::nn::Module> model) {
  TANDEM_CHECK_ARG(model != nullptr, "Accelerator::prepare_model: the model is null");
  TANDEM_CHECK_ARG(model_ == nullptr,
                   "Accelerator::prepare_model: a model was already prepared; one Accelerator "
                   "trains one model (prepare a container module holding both instead)");
  detail::check_model_consistency(*process_group_, *model);
  // In place: parameters keep their identity, so an optimizer built before
  // prepare() still holds the right tensors.
  model->to(device_);
  // One process has nothing to synchronise (as Accelerate, which does not
  // wrap at num_processes == 1).
  // ZeRO shards when the optimizer is prepared: it needs both.
  if (num_processes() > 1 && config_.zero.stage == 0) {
    ddp_ = std::make_shared<DistributedDataParallel>(model, process_group_, *ddp_options_);
    controller_->attach(ddp_);
  }
  model_ = model;
  return model;
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer(
    std::shared_ptr<torch::optim::Optimizer> optimizer) {
  TANDEM_CHECK_ARG(optimizer != nullptr, "Accelerator::prepare_optimizer: the optimizer is null");
  TANDEM_CHECK_ARG(optimizer_ == nullptr,
                   "Accelerator::prepare_optimizer: an optimizer was already prepared; this "
                   "version of tandem steps one optimizer per Accelerator (put all parameter "
                   "groups in one optimizer)");
  TANDEM_CHECK_ARG(dynamic_cast<AcceleratedOptimizer*>(optimizer.get()) == nullptr,
                   "Accelerator::prepare_optimizer: the optimizer is already prepared");
  const bool sharded = config_.zero.stage > 0;
  TANDEM_CHECK_ARG(!sharded || model_ != nullptr,
                   "Accelerator::prepare_optimizer: ZeRO stage {} shards the model together "
                   "with its optimizer; prepare the model first (or use prepare(model, "
                   "optimizer, data))",
                   config_.zero.stage);
  warn_if_listed_twice(*optimizer, model_.get(), sharded);
  detail::OptimizerCore::Parts parts;
  parts.wrapped = optimizer;
  parts.controller = controller_;
  parts.scaler = scaler_;
  parts.gradient_clipping = config_.gradient_clipping;
  parts.group = process_group_;
  auto core = std::make_unique<detail::OptimizerCore>(std::move(parts));
  detail::OptimizerCore& core_ref = *core;
  auto prepared = std::shared_ptr<AcceleratedOptimizer>(
      new AcceleratedOptimizer(std::move(optimizer), std::move(core), sharded));
  if (sharded) {
    ZeroOptions zero;
    zero.stage = config_.zero.stage;
    zero.reduce_bucket_size = config_.zero.reduce_bucket_size;
    zero.offload_optimizer = config_.zero.offload_optimizer == OffloadDevice::kCpu;
    zero.offload_param = config_.zero.offload_param == OffloadDevice::kCpu;
    zero.pin_memory = config_.zero.offload_pin_memory;
    zero.prefetch = config_.zero.stage3_prefetch_bucket_size != 0;
    zero_ = std::make_shared<ZeroOptimizer>(model_, *prepared, process_group_, zero);
    core_ref.attach_zero(zero_);
    controller_->attach(zero_);
  }
  optimizer_ = prepared;
  return prepared;
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer_from_config(
    double default_lr) {
  TANDEM_CHECK_ARG(model_ != nullptr, "Accelerator::prepare_optimizer_from_config: prepare the "
                   "model first; the optimizer is built over its parameters");
  TANDEM_CHECK_ARG(optimizer_ == nullptr,
                   "Accelerator::prepare_optimizer_from_config: an optimizer was already "
                   "prepared (one optimizer per Accelerator)");
  // Over each tensor once, as Python's parameters() gives them: a tied
  // weight listed twice would be stepped twice.
  std::shared_ptr<torch::optim::Optimizer> optimizer =
      make_optimizer(config_.optimizer, unique_parameters(*model_), default_lr);
  return prepare_optimizer(std::move(optimizer));
}

namespace {

std::shared_ptr<detail::SchedulerCore> scheduler_core(
    std::shared_ptr<AcceleratedOptimizer> optimizer,
    std::shared_ptr<const detail::StepController> controller) {
  auto core = std::make_shared<detail::SchedulerCore>();
  core->optimizer = std::move(optimizer);
  core->controller = std::move(controller);
  return core;
}

}  // namespace

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(
    std::shared_ptr<LRScheduler> scheduler) {
  TANDEM_CHECK_ARG(scheduler != nullptr, "Accelerator::prepare_scheduler: the scheduler is null");
  auto core = scheduler_core(optimizer_, controller_);
  LRScheduler* s = scheduler.get();
  core->owned = std::move(scheduler);
  core->step_fn = [s] { s->step(); };
  core->state_dict = [s] { return s->state_dict(); };
  core->load_state_dict = [s](const std::map<std::string, double>& state) {
    s->load_state_dict(state);
  };
  schedulers_.push_back(core);
  return std::shared_ptr<AcceleratedScheduler>(new AcceleratedScheduler(core));
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(
    std::shared_ptr<torch::optim::LRScheduler> scheduler) {
  TANDEM_CHECK_ARG(scheduler != nullptr, "Accelerator::prepare_scheduler: the scheduler is null");
  auto core = scheduler_core(optimizer_, controller_);
  torch::optim::LRScheduler* s = scheduler.get();
  core->owned = std::move(scheduler);
  core->step_fn = [s] { s->step(); };
  schedulers_.push_back(core);
  return std::shared_ptr<AcceleratedScheduler>(new AcceleratedScheduler(core));
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler_from_config(
    const std::shared_ptr<AcceleratedOptimizer>& optimizer, int64_t total_num_steps) {
  TANDEM_CHECK_ARG(!config_.scheduler.type.empty(),
                   "Accelerator::prepare_scheduler_from_config: the config has no `scheduler` "
                   "block. Add one (e.g. {{\"type\": \"WarmupLR\", \"params\": {{...}}}}) or build "
                   "a scheduler in code and pass it to prepare_scheduler()");
  TANDEM_CHECK_ARG(optimizer != nullptr,
                   "Accelerator::prepare_scheduler_from_config: the optimizer is null");
  auto& groups = optimizer->param_groups();
  TANDEM_CHECK_ARG(!groups.empty(), "prepare_scheduler_from_config: the optimizer has no groups");
  const double lr = groups.front().options().get_lr();
  std::map<std::string, double> auto_values = {{"warmup_max_lr", lr}, {"cycle_max_lr", lr}};
  if (total_num_steps > 0) auto_values["total_num_steps"] = static_cast<double>(total_num_steps);
  return prepare_scheduler(make_lr_scheduler(config_.scheduler, *optimizer, auto_values));
}

DistributedLoaderOptions Accelerator::data_options(DistributedLoaderOptions options) {
  validate(options);
  // The first loader is the training data: its batch is the micro batch of
  // the config's batch triple. Later ones (evaluation) change nothing.
  if (!training_data_prepared_) resolve(options.batch_size);
  training_data_prepared_ = true;
  if (options.device.is_cpu()) options.device = device_;
  return options;
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_data_loader(std::vector<at::Tensor> tensors,
                                                                 DistributedLoaderOptions options) {
  options = data_options(options);
  return wrap_loader(DistributedLoader(std::move(tensors), *process_group_, options));
}

std::shared_ptr<PreparedLoader> Accelerator::wrap_loader(DistributedLoader loader) {
  auto cursor = std::make_shared<detail::LoaderCursor>();
  // The first loader prepared is the training data: checkpoints keep its
  // position (evaluation loaders restart every pass anyway).
  if (train_cursor_ == nullptr) train_cursor_ = cursor;
  return std::shared_ptr<PreparedLoader>(
      new PreparedLoader(std::move(loader), controller_, std::move(cursor), process_group_));
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_local_loader(DistributedLoader loader) {
  if (!training_data_prepared_) resolve(loader.options().batch_size);
  training_data_prepared_ = true;
  return wrap_loader(std::move(loader));
}

void Accelerator::backward(const at::Tensor& loss) {
  TANDEM_CHECK_ARG(loss.defined() && loss.numel() == 1,
                   "Accelerator::backward: the loss must be a scalar tensor, got shape {}",
                   loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
  if (optimizer_) optimizer_->core_->check_wrapped(*optimizer_);
  controller_->before_backward();
  // A loss computed under autocast may be bf16/fp16; backward starts in fp32
  // (Accelerate casts model outputs back to fp32 for the same reason).
  at::Tensor scaled = to_fp32(loss);
  const GradientState& state = controller_->state();
  double factor = 1.0 / static_cast<double>(state.accumulation_steps);
  if (state.joining) factor *= join_gradient_weight();
  if (scaler_->enabled()) factor *= scaler_->scale();
  if (factor != 1.0) scaled = scaled * factor;
  scaled.backward();
  controller_->after_backward();
}

Accelerator::AccumulateGuard::AccumulateGuard(std::shared_ptr<detail::StepController> controller)
    : controller_(std::move(controller)), outer_was_open_(controller_->enter_accumulate_guard()) {}

Accelerator::AccumulateGuard::~AccumulateGuard() {
  controller_->leave_accumulate_guard(outer_was_open_);
}

Accelerator::AccumulateGuard Accelerator::accumulate() { return AccumulateGuard(controller_); }

Accelerator::AccumulateGuard Accelerator::accumulate(
    const std::shared_ptr<torch::nn::Module>& model) {
  TANDEM_CHECK_ARG(model != nullptr && model == model_,
                   "Accelerator::accumulate(model): {} is not the model this Accelerator "
                   "prepared; pass the prepared model (or call accumulate() without one)",
                   model == nullptr ? "a null model" : "the model given");
  return AccumulateGuard(controller_);
}

double Accelerator::clip_grad_norm(double max_norm, double norm_type) {
  TANDEM_CHECK_ARG(optimizer_ != nullptr,
                   "Accelerator::clip_grad_norm: prepare the optimizer first (prepare() or "
                   "prepare_optimizer()); tandem clips the parameters it holds");
  if (!controller_->state().sync_gradients) return std::numeric_limits<double>::quiet_NaN();
  // DDP gradients are identical on every rank after the all-reduce, so the
  // local norm is the global one.
  return optimizer_->core_->clip(*optimizer_, max_norm, norm_type);
}

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

ProgressBar Accelerator::progress_bar(int64_t total, std::string description) const {
  return ProgressBar(total, std::move(description), is_local_main_process());
}

void Accelerator::init_trackers(const std::string& path,
                                const std::map<std::string, HParamValue>& config) {
  metrics_.open(path, is_main_process());
  tensorboard_.reset();
  if (log_tensorboard_ && is_main_process()) {
    std::string dir = project_dir_;
    if (dir.empty()) {
      const auto slash = path.rfind('/');
      dir = slash == std::string::npos ? "." : path.substr(0, slash);
    }
    tensorboard_ = std::make_unique<TensorBoardWriter>(dir);
    if (!config.empty()) tensorboard_->add_hparams(config);
  }
}

void Accelerator::log(const std::map<std::string, double>& values, int64_t step) {
  metrics_.log(values, step);
  if (tensorboard_) {
    for (const auto& [tag, value] : values) tensorboard_->add_scalar(tag, value, step);
  }
}

void Accelerator::end_training() {
  metrics_.close();
  tensorboard_.reset();
  wait_for_everyone();
}

}  // namespace tandem
