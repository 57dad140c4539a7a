// Accelerator: construction, prepare and stepping. The collective helpers
// (gather, reduce, ...) are in accelerator_collectives.cpp.

#include "tandem/accelerate/accelerator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include "accelerate/consistency_check.h"
#include "accelerate/model_strategy.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "tandem/amp/autocast.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/optim/optimizer_factory.h"
#include "tandem/core/logging.h"
#include "tandem/optim/lr_scheduler.h"
#include "tandem/parallel/activation_checkpoint.h"

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
  for (const auto& prepared : models_) {
    TANDEM_CHECK_ARG(prepared.module != model,
                     "Accelerator::prepare_model: this model was already prepared; prepare "
                     "each model once and keep using the same object");
  }
  detail::check_model_consistency(*process_group_, *model);
  detail::refuse_cut_model_off_host(*model, device_);
  // In place: parameters keep their identity, so an optimizer built before
  // prepare() still holds the right tensors.
  model->to(device_);
  apply_activation_checkpointing(*model, config_.activation_checkpointing);
  PreparedModel prepared;
  prepared.module = model;
  prepared.prefix = detail::model_prefix(models_.size());
  detail::ModelStrategyParts parts;
  parts.module = model;
  parts.group = process_group_;
  parts.controller = controller_;
  parts.zero = config_.zero;
  parts.ddp = *ddp_options_;
  prepared.strategy = detail::make_model_strategy(std::move(parts));
  models_.push_back(std::move(prepared));
  models_checked_ = false;
  join_hooks_.reset();  // reinstalled over every model at the next joined backward
  return model;
}

std::size_t Accelerator::check_prepared(const std::shared_ptr<torch::nn::Module>& model,
                                        const char* caller) const {
  for (std::size_t i = 0; i < models_.size(); ++i) {
    if (model != nullptr && models_[i].module == model) return i;
  }
  TANDEM_THROW(UsageError,
               "Accelerator::{}: {} is not a model this Accelerator prepared ({} prepared); pass "
               "the object prepare_model() returned",
               caller, model == nullptr ? "a null model" : "the model given", models_.size());
}

AcceleratedOptimizer& Accelerator::only_optimizer(const char* caller) const {
  TANDEM_CHECK_ARG(!optimizers_.empty(),
                   "Accelerator::{}: prepare the optimizer first (prepare() or "
                   "prepare_optimizer())",
                   caller);
  TANDEM_CHECK_ARG(optimizers_.size() == 1,
                   "Accelerator::{}: {} optimizers are prepared; name the one to act on "
                   "(the overload that takes the prepared optimizer)",
                   caller, optimizers_.size());
  return *optimizers_.front();
}

std::shared_ptr<torch::nn::Module> Accelerator::unwrap_model() const {
  return models_.empty() ? nullptr : models_.front().module;
}

std::shared_ptr<ZeroOptimizer> Accelerator::zero_optimizer() const {
  return models_.empty() ? nullptr : models_.front().strategy->zero();
}

std::shared_ptr<ZeroOptimizer> Accelerator::zero_optimizer(
    const std::shared_ptr<torch::nn::Module>& model) const {
  return models_[check_prepared(model, "zero_optimizer")].strategy->zero();
}

namespace {

// The index of the prepared model that holds every parameter of
// `optimizer`, for ZeRO, which shards a model together with its optimizer.
std::size_t model_of_optimizer(torch::optim::Optimizer& optimizer,
                               const std::vector<std::shared_ptr<torch::nn::Module>>& models) {
  std::unordered_map<const void*, std::size_t> owner;
  for (std::size_t m = 0; m < models.size(); ++m) {
    for (const auto& p : unique_parameters(*models[m])) owner.emplace(p.unsafeGetTensorImpl(), m);
  }
  std::optional<std::size_t> found;
  for (const auto& p : unique_optimizer_parameters(optimizer)) {
    const auto it = owner.find(p.unsafeGetTensorImpl());
    TANDEM_CHECK_ARG(it != owner.end(),
                     "Accelerator::prepare_optimizer: under ZeRO the optimizer holds a tensor of "
                     "shape [{}] that is no parameter of a prepared model; prepare the model "
                     "first and build the optimizer over its parameters",
                     fmt::join(p.sizes(), ", "));
    TANDEM_CHECK_ARG(!found || *found == it->second,
                     "Accelerator::prepare_optimizer: under ZeRO an optimizer shards one model, "
                     "but this one holds parameters of prepared models {} and {}. Build one "
                     "optimizer per model (or prepare one container module holding both)",
                     *found, it->second);
    found = it->second;
  }
  TANDEM_CHECK_ARG(found.has_value(), "Accelerator::prepare_optimizer: the optimizer holds no "
                   "parameters");
  return *found;
}

}  // namespace

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer(
    std::shared_ptr<torch::optim::Optimizer> optimizer) {
  TANDEM_CHECK_ARG(optimizer != nullptr, "Accelerator::prepare_optimizer: the optimizer is null");
  TANDEM_CHECK_ARG(dynamic_cast<AcceleratedOptimizer*>(optimizer.get()) == nullptr,
                   "Accelerator::prepare_optimizer: the optimizer is already prepared");
  for (const auto& prepared : optimizers_) {
    TANDEM_CHECK_ARG(&prepared->core_->wrapped() != optimizer.get(),
                     "Accelerator::prepare_optimizer: this optimizer was already prepared; use "
                     "the object prepare_optimizer() returned");
    std::unordered_map<const void*, bool> held;
    for (const auto& p : unique_optimizer_parameters(*prepared)) held[p.unsafeGetTensorImpl()] = true;
    for (const auto& p : unique_optimizer_parameters(*optimizer)) {
      TANDEM_CHECK_ARG(!held.count(p.unsafeGetTensorImpl()),
                       "Accelerator::prepare_optimizer: a parameter of shape [{}] is already "
                       "held by another prepared optimizer; two optimizers stepping one tensor "
                       "would each apply an update. Give each optimizer its own parameters",
                       fmt::join(p.sizes(), ", "));
    }
  }
  // Under ZeRO an optimizer belongs to the one model it shards, prepared
  // before it; otherwise it stands alone and may span models.
  const bool bound = detail::binds_optimizers(config_.zero);
  TANDEM_CHECK_ARG(!bound || !models_.empty(),
                   "Accelerator::prepare_optimizer: ZeRO stage {} shards the model together "
                   "with its optimizer; prepare the model first (or use prepare(model, "
                   "optimizer, data))",
                   config_.zero.stage);
  std::optional<std::size_t> owner;
  if (bound) {
    std::vector<std::shared_ptr<torch::nn::Module>> modules;
    for (const auto& m : models_) modules.push_back(m.module);
    owner = model_of_optimizer(*optimizer, modules);
  }
  std::shared_ptr<torch::nn::Module> model =
      owner ? models_[*owner].module : (models_.empty() ? nullptr : models_.front().module);
  warn_if_listed_twice(*optimizer, model.get(), bound);
  detail::OptimizerCore::Parts parts;
  parts.wrapped = optimizer;
  parts.controller = controller_;
  parts.scaler = scaler_;
  parts.gradient_clipping = config_.gradient_clipping;
  parts.group = process_group_;
  auto core = std::make_unique<detail::OptimizerCore>(std::move(parts));
  detail::OptimizerCore& core_ref = *core;
  auto prepared = std::shared_ptr<AcceleratedOptimizer>(
      new AcceleratedOptimizer(std::move(optimizer), std::move(core)));
  core_ref.set_update(owner ? models_[*owner].strategy->attach_optimizer(*prepared)
                            : detail::make_replicated_update(*prepared));
  if (owner) models_[*owner].optimizers.push_back(optimizers_.size());
  optimizers_.push_back(prepared);
  models_checked_ = false;
  return prepared;
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer_from_config(
    double default_lr) {
  TANDEM_CHECK_ARG(models_.size() == 1,
                   "Accelerator::prepare_optimizer_from_config: {}; the optimizer is built over "
                   "the model's parameters",
                   models_.empty() ? "prepare the model first"
                                   : "several models are prepared, so name the model");
  return prepare_optimizer_from_config(models_.front().module, default_lr);
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer_from_config(
    const std::shared_ptr<torch::nn::Module>& model, double default_lr) {
  const std::size_t index = check_prepared(model, "prepare_optimizer_from_config");
  // Over each tensor once, as Python's parameters() gives them: a tied
  // weight listed twice would be stepped twice.
  std::shared_ptr<torch::optim::Optimizer> optimizer =
      make_optimizer(config_.optimizer, unique_parameters(*models_[index].module), default_lr);
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
  // It names its optimizer: the prepared one, or the one passed to prepare.
  std::shared_ptr<AcceleratedOptimizer> optimizer;
  for (const auto& prepared : optimizers_) {
    if (&scheduler->optimizer() == prepared.get() ||
        &scheduler->optimizer() == &prepared->core_->wrapped()) {
      optimizer = prepared;
    }
  }
  TANDEM_CHECK_ARG(optimizer != nullptr || optimizers_.size() <= 1,
                   "Accelerator::prepare_scheduler: the scheduler drives an optimizer that was "
                   "not prepared; build it over a prepared optimizer");
  if (optimizer == nullptr && !optimizers_.empty()) optimizer = optimizers_.front();
  auto core = scheduler_core(optimizer, controller_);
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
    std::shared_ptr<torch::optim::LRScheduler> scheduler,
    std::shared_ptr<AcceleratedOptimizer> optimizer) {
  TANDEM_CHECK_ARG(scheduler != nullptr, "Accelerator::prepare_scheduler: the scheduler is null");
  if (optimizer == nullptr) {
    TANDEM_CHECK_ARG(optimizers_.size() <= 1,
                     "Accelerator::prepare_scheduler: {} optimizers are prepared and a LibTorch "
                     "scheduler does not say which one it drives; pass it: "
                     "prepare_scheduler(scheduler, optimizer)",
                     optimizers_.size());
    if (!optimizers_.empty()) optimizer = optimizers_.front();
  } else {
    TANDEM_CHECK_ARG(std::find(optimizers_.begin(), optimizers_.end(), optimizer) !=
                         optimizers_.end(),
                     "Accelerator::prepare_scheduler: the optimizer given was not prepared by "
                     "this Accelerator");
  }
  auto core = scheduler_core(std::move(optimizer), controller_);
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

DistributedLoaderOptions Accelerator::data_options(DistributedLoaderOptions options) const {
  // Batches go to the training device unless the caller named one.
  if (options.device.is_cpu()) options.device = device_;
  return options;
}

// The loaders validate their options (once, in DistributedLoader's
// constructor) before wrap_loader() lets the first one set the batch size.
std::shared_ptr<PreparedLoader> Accelerator::prepare_data_loader(std::vector<at::Tensor> tensors,
                                                                 DistributedLoaderOptions options) {
  return wrap_loader(DistributedLoader(std::move(tensors), *process_group_, data_options(options)));
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_data_loader(DistributedLoader::Fetch fetch,
                                                                 int64_t dataset_size,
                                                                 DistributedLoaderOptions options) {
  return wrap_loader(DistributedLoader(std::move(fetch), dataset_size, *process_group_,
                                       data_options(options)));
}

std::shared_ptr<PreparedLoader> Accelerator::wrap_loader(DistributedLoader loader) {
  // The first loader is the training data: its batch is the micro batch of
  // the config's batch triple. Later ones (evaluation) change nothing.
  if (!training_data_prepared_) resolve(loader.options().batch_size);
  training_data_prepared_ = true;
  auto cursor = std::make_shared<detail::LoaderCursor>();
  // The first loader prepared is the training data: checkpoints keep its
  // position (evaluation loaders restart every pass anyway).
  if (train_cursor_ == nullptr) train_cursor_ = cursor;
  return std::shared_ptr<PreparedLoader>(
      new PreparedLoader(std::move(loader), controller_, std::move(cursor), process_group_));
}

std::shared_ptr<PreparedLoader> Accelerator::prepare_local_loader(DistributedLoader loader) {
  return wrap_loader(std::move(loader));
}

void Accelerator::backward(const at::Tensor& loss) {
  TANDEM_CHECK_ARG(loss.defined() && loss.numel() == 1,
                   "Accelerator::backward: the loss must be a scalar tensor, got shape {}",
                   loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
  for (const auto& optimizer : optimizers_) optimizer->core_->check_wrapped(*optimizer);
  if (!models_checked_) check_models_synchronised();
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
  for (const auto& optimizer : optimizers_) optimizer->core_->note_backward(*optimizer);
}

Accelerator::AccumulateGuard::AccumulateGuard(std::shared_ptr<detail::StepController> controller)
    : controller_(std::move(controller)), outer_was_open_(controller_->enter_accumulate_guard()) {}

Accelerator::AccumulateGuard::~AccumulateGuard() {
  controller_->leave_accumulate_guard(outer_was_open_);
}

void Accelerator::check_models_synchronised() {
  for (std::size_t i = 0; i < models_.size(); ++i) models_[i].strategy->check_ready(i);
  models_checked_ = true;
}

double Accelerator::clip_grad_norm(double max_norm, double norm_type) {
  AcceleratedOptimizer& optimizer = only_optimizer("clip_grad_norm");
  if (!controller_->state().sync_gradients) return std::numeric_limits<double>::quiet_NaN();
  // DDP gradients are identical on every rank after the all-reduce, so the
  // local norm is the global one.
  return optimizer.core_->clip(optimizer, max_norm, norm_type);
}

double Accelerator::clip_grad_norm(const std::shared_ptr<AcceleratedOptimizer>& optimizer,
                                   double max_norm, double norm_type) {
  TANDEM_CHECK_ARG(optimizer != nullptr &&
                       std::find(optimizers_.begin(), optimizers_.end(), optimizer) !=
                           optimizers_.end(),
                   "Accelerator::clip_grad_norm: the optimizer given was not prepared by this "
                   "Accelerator");
  if (!controller_->state().sync_gradients) return std::numeric_limits<double>::quiet_NaN();
  return optimizer->core_->clip(*optimizer, max_norm, norm_type);
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
