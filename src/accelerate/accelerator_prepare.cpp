// Accelerator::prepare_*: models (each held by its strategy), optimizers,
// schedulers and data loaders, and looking prepared objects up again.

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
#include "accelerate/strategy_factory.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "accelerate/wall_clock_timer.h"
#include "tandem/amp/autocast.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/core/logging.h"
#include "tandem/optim/optimizer_factory.h"
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
  prepared.strategy = strategies_->make(model, controller_);
  if (step_timer_) step_timer_->add_model(prepared.strategy);
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
  return models_.empty() ? nullptr : zero_optimizer(models_.front().module);
}

std::shared_ptr<ZeroOptimizer> Accelerator::zero_optimizer(
    const std::shared_ptr<torch::nn::Module>& model) const {
  const detail::PartitionedParameters* partitioned =
      models_[check_prepared(model, "zero_optimizer")].strategy->partitioned();
  return partitioned != nullptr ? partitioned->zero() : nullptr;
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
  const bool bound = strategies_->binds_optimizers();
  TANDEM_CHECK_ARG(!bound || !models_.empty(),
                   "Accelerator::prepare_optimizer: ZeRO shards the model together with its "
                   "optimizer; prepare the model first (or use prepare(model, optimizer, data))");
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
  parts.timer = step_timer_;
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

}  // namespace tandem
