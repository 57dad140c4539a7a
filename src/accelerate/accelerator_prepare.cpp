// Accelerator::prepare_model, prepare_optimizer and prepare_scheduler:
// models (each held by the strategy StrategyFactory picks), the optimizers
// over them and their schedulers, registered in PreparedObjects. Data
// loaders are DataPreparation's (data_preparation.h).

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
#include "accelerate/accelerator_impl.h"
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

void detail::refuse_cut_model_off_host(const torch::nn::Module& model, c10::Device device) {
  for (const auto& p : model.parameters()) {
    TANDEM_CHECK_ARG(holds_memory(p) || p.device() == device,
                     "Accelerator::prepare_model: the model was built under a zero::Init that "
                     "cut its units on {}, and it trains on {}; cut units cannot move. Build it "
                     "under accelerator.zero_init(), which cuts on the training device, or pass "
                     "that device to zero::Init",
                     p.device().str(), device.str());
  }
}

std::shared_ptr<torch::nn::Module> Accelerator::prepare_model(
    std::shared_ptr<torch::nn::Module> model) {
  Impl& s = *impl_;
  TANDEM_CHECK_ARG(model != nullptr, "Accelerator::prepare_model: the model is null");
  for (const auto& prepared : s.prepared.models()) {
    TANDEM_CHECK_ARG(prepared.module != model,
                     "Accelerator::prepare_model: this model was already prepared; prepare "
                     "each model once and keep using the same object");
  }
  detail::check_model_consistency(*s.group, *model);
  detail::refuse_cut_model_off_host(*model, s.device);
  // In place: parameters keep their identity, so an optimizer built before
  // prepare() still holds the right tensors.
  model->to(s.device);
  apply_activation_checkpointing(*model, s.config.activation_checkpointing);
  detail::PreparedModel prepared;
  prepared.module = model;
  prepared.prefix = detail::model_prefix(s.prepared.models().size());
  prepared.strategy = s.strategies->make(model, s.prepared.controller());
  if (s.trackers->timer()) s.trackers->timer()->add_model(prepared.strategy);
  s.prepared.models().push_back(std::move(prepared));
  s.models_checked = false;
  s.join_hooks.reset();  // reinstalled over every model at the next joined backward
  return model;
}

std::shared_ptr<torch::nn::Module> Accelerator::unwrap_model() const {
  Impl& s = *impl_;
  return s.prepared.models().empty() ? nullptr : s.prepared.models().front().module;
}

std::shared_ptr<ZeroOptimizer> Accelerator::zero_optimizer() const {
  Impl& s = *impl_;
  return s.prepared.models().empty() ? nullptr
                                     : zero_optimizer(s.prepared.models().front().module);
}

std::shared_ptr<ZeroOptimizer> Accelerator::zero_optimizer(
    const std::shared_ptr<torch::nn::Module>& model) const {
  Impl& s = *impl_;
  const detail::PartitionedParameters* partitioned =
      s.prepared.models()[s.index_of(model, "zero_optimizer")].strategy->partitioned();
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
  Impl& s = *impl_;
  TANDEM_CHECK_ARG(optimizer != nullptr, "Accelerator::prepare_optimizer: the optimizer is null");
  TANDEM_CHECK_ARG(dynamic_cast<AcceleratedOptimizer*>(optimizer.get()) == nullptr,
                   "Accelerator::prepare_optimizer: the optimizer is already prepared");
  for (const auto& prepared : s.prepared.optimizers()) {
    TANDEM_CHECK_ARG(&detail::PreparedAccess::core(*prepared).wrapped() != optimizer.get(),
                     "Accelerator::prepare_optimizer: this optimizer was already prepared; use "
                     "the object prepare_optimizer() returned");
    std::unordered_map<const void*, bool> held;
    for (const auto& p : unique_optimizer_parameters(*prepared)) {
      held[p.unsafeGetTensorImpl()] = true;
    }
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
  const bool bound = s.strategies->binds_optimizers();
  TANDEM_CHECK_ARG(!bound || !s.prepared.models().empty(),
                   "Accelerator::prepare_optimizer: ZeRO shards the model together with its "
                   "optimizer; prepare the model first (or use prepare(model, optimizer, data))");
  std::optional<std::size_t> owner;
  if (bound) {
    owner = model_of_optimizer(*optimizer, s.prepared.modules());
  }
  std::shared_ptr<torch::nn::Module> model =
      owner ? s.prepared.models()[*owner].module : unwrap_model();
  warn_if_listed_twice(*optimizer, model.get(), bound);
  detail::OptimizerCore::Parts parts;
  parts.wrapped = optimizer;
  parts.controller = s.prepared.controller();
  parts.scaler = s.scaler;
  parts.gradient_clipping = s.config.gradient_clipping;
  parts.group = s.group;
  parts.timer = s.trackers->timer();
  auto core = std::make_unique<detail::OptimizerCore>(std::move(parts));
  detail::OptimizerCore& core_ref = *core;
  auto prepared = detail::PreparedAccess::make_optimizer(std::move(optimizer), std::move(core));
  core_ref.set_update(owner ? s.prepared.models()[*owner].strategy->attach_optimizer(*prepared)
                            : detail::make_replicated_update(
                                  *prepared, /*keep_gradients=*/s.group->world_size() > 1));
  if (owner) s.prepared.models()[*owner].optimizers.push_back(s.prepared.optimizers().size());
  s.prepared.optimizers().push_back(prepared);
  s.models_checked = false;
  return prepared;
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer_from_config(
    double default_lr) {
  Impl& s = *impl_;
  TANDEM_CHECK_ARG(s.prepared.models().size() == 1,
                   "Accelerator::prepare_optimizer_from_config: {}; the optimizer is built over "
                   "the model's parameters",
                   s.prepared.models().empty()
                       ? "prepare the model first"
                       : "several models are prepared, so name the model");
  return prepare_optimizer_from_config(s.prepared.models().front().module, default_lr);
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer_from_config(
    const std::shared_ptr<torch::nn::Module>& model, double default_lr) {
  Impl& s = *impl_;
  const std::size_t index = s.index_of(model, "prepare_optimizer_from_config");
  // Over each tensor once, as Python's parameters() gives them: a tied
  // weight listed twice would be stepped twice.
  std::shared_ptr<torch::optim::Optimizer> optimizer = make_optimizer(
      s.config.optimizer, unique_parameters(*s.prepared.models()[index].module), default_lr);
  return prepare_optimizer(std::move(optimizer));
}

namespace {

// As Accelerate's AcceleratedScheduler: with the optimizer, num_processes
// wrapped steps per optimizer step unless split_batches (a schedule written
// for one process then ends at the same fraction of the data).
std::shared_ptr<detail::SchedulerCore> scheduler_core(
    std::shared_ptr<AcceleratedOptimizer> optimizer,
    std::shared_ptr<const detail::StepController> controller, int64_t steps_per_optimizer_step) {
  auto core = std::make_shared<detail::SchedulerCore>();
  core->optimizer = std::move(optimizer);
  core->controller = std::move(controller);
  core->steps_per_optimizer_step = steps_per_optimizer_step;
  return core;
}

}  // namespace

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(
    std::shared_ptr<LRScheduler> scheduler) {
  Impl& s = *impl_;
  TANDEM_CHECK_ARG(scheduler != nullptr, "Accelerator::prepare_scheduler: the scheduler is null");
  // It names its optimizer: the prepared one, or the one passed to prepare.
  std::shared_ptr<AcceleratedOptimizer> optimizer;
  for (const auto& prepared : s.prepared.optimizers()) {
    if (&scheduler->optimizer() == prepared.get() ||
        &scheduler->optimizer() == &detail::PreparedAccess::core(*prepared).wrapped()) {
      optimizer = prepared;
    }
  }
  TANDEM_CHECK_ARG(optimizer != nullptr || s.prepared.optimizers().size() <= 1,
                   "Accelerator::prepare_scheduler: the scheduler drives an optimizer that was "
                   "not prepared; build it over a prepared optimizer");
  if (optimizer == nullptr && !s.prepared.optimizers().empty()) {
    optimizer = s.prepared.optimizers().front();
  }
  auto core = scheduler_core(optimizer, s.prepared.controller(),
                             s.scheduler_steps_per_optimizer_step());
  LRScheduler* raw = scheduler.get();
  core->owned = std::move(scheduler);
  core->step_fn = [raw] { raw->step(); };
  core->state_dict = [raw] { return raw->state_dict(); };
  core->load_state_dict = [raw](const std::map<std::string, double>& state) {
    raw->load_state_dict(state);
  };
  s.prepared.schedulers().push_back(core);
  return detail::PreparedAccess::make_scheduler(core);
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(
    std::shared_ptr<torch::optim::LRScheduler> scheduler,
    std::shared_ptr<AcceleratedOptimizer> optimizer) {
  Impl& s = *impl_;
  TANDEM_CHECK_ARG(scheduler != nullptr, "Accelerator::prepare_scheduler: the scheduler is null");
  if (optimizer == nullptr) {
    TANDEM_CHECK_ARG(s.prepared.optimizers().size() <= 1,
                     "Accelerator::prepare_scheduler: {} optimizers are prepared and a LibTorch "
                     "scheduler does not say which one it drives; pass it: "
                     "prepare_scheduler(scheduler, optimizer)",
                     s.prepared.optimizers().size());
    if (!s.prepared.optimizers().empty()) optimizer = s.prepared.optimizers().front();
  } else {
    const auto& optimizers = s.prepared.optimizers();
    TANDEM_CHECK_ARG(std::find(optimizers.begin(), optimizers.end(), optimizer) != optimizers.end(),
                     "Accelerator::prepare_scheduler: the optimizer given was not prepared by "
                     "this Accelerator");
  }
  auto core = scheduler_core(std::move(optimizer), s.prepared.controller(),
                             s.scheduler_steps_per_optimizer_step());
  torch::optim::LRScheduler* raw = scheduler.get();
  core->owned = std::move(scheduler);
  core->step_fn = [raw] { raw->step(); };
  s.prepared.schedulers().push_back(core);
  return detail::PreparedAccess::make_scheduler(core);
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler_from_config(
    const std::shared_ptr<AcceleratedOptimizer>& optimizer, int64_t total_num_steps,
    int64_t warmup_num_steps) {
  Impl& s = *impl_;
  TANDEM_CHECK_ARG(!s.config.scheduler.type.empty(),
                   "Accelerator::prepare_scheduler_from_config: the config has no `scheduler` "
                   "block. Add one (e.g. {{\"type\": \"WarmupLR\", \"params\": {{...}}}}) or build "
                   "a scheduler in code and pass it to prepare_scheduler()");
  TANDEM_CHECK_ARG(optimizer != nullptr,
                   "Accelerator::prepare_scheduler_from_config: the optimizer is null");
  auto& groups = optimizer->param_groups();
  TANDEM_CHECK_ARG(!groups.empty(), "prepare_scheduler_from_config: the optimizer has no groups");
  const double lr = groups.front().options().get_lr();
  TANDEM_CHECK_ARG(total_num_steps >= 0 && warmup_num_steps >= 0,
                   "prepare_scheduler_from_config: total_num_steps ({}) and warmup_num_steps "
                   "({}) must be >= 0 (0: not known)",
                   total_num_steps, warmup_num_steps);
  // What Accelerate fills into a DeepSpeed scheduler's "auto" values for its
  // DummyScheduler(optimizer, total_num_steps, warmup_num_steps): the start
  // at 0, the peak at the optimizer's lr, at least 1 warmup step.
  std::map<std::string, double> auto_values = {
      {"warmup_min_lr", 0.0},
      {"warmup_max_lr", lr},
      {"cycle_max_lr", lr},
      {"warmup_num_steps", static_cast<double>(std::max<int64_t>(1, warmup_num_steps))}};
  if (total_num_steps > 0) auto_values["total_num_steps"] = static_cast<double>(total_num_steps);
  auto prepared = prepare_scheduler(make_lr_scheduler(s.config.scheduler, *optimizer, auto_values));
  // DeepSpeed's engine steps the config's scheduler once per optimizer step,
  // under Accelerate too (its DeepSpeed path bypasses AcceleratedScheduler).
  s.prepared.schedulers().back()->steps_per_optimizer_step = 1;
  return prepared;
}

}  // namespace tandem
