// Accelerator: construction and configuration, backward and gradient
// accumulation, clipping, seeding and logging. Preparing objects is in
// accelerator_prepare.cpp, the collective helpers (gather, reduce, ...) in
// accelerator_collectives.cpp, checkpoints in accelerator_checkpoint.cpp.

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
// The step timer they share stops reporting to this Accelerator's trackers.
Accelerator::~Accelerator() {
  if (step_timer_) step_timer_->set_sink(nullptr);
}

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
  overrides_.wall_clock_breakdown = options.wall_clock_breakdown;
  overrides_.steps_per_print = options.steps_per_print;
  controller_ = std::make_shared<detail::StepController>();
  // "auto" ZeRO sizes, from the hidden size as Accelerate fills them.
  if (options.hidden_size) fill_hidden_size_auto(file_config_, *options.hidden_size);
  resolve(0);
  detail::check_config_consistency(*process_group_, config_);
  // Every rank, in the same order: HSDP's split of the world is collective.
  strategies_ = std::make_shared<const detail::StrategyFactory>(config_, options.ddp,
                                                                process_group_, local_world_size_);
  if (is_main_process()) {
    for (const auto& warning : config_.warnings) log_warn("{}", warning);
    strategies_->warn_unfilled_auto_sizes(config_);
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
  if (config_.seed) set_seed(*config_.seed);
  if (config_.wall_clock_breakdown || config_.steps_per_print) {
    detail::WallClockTimer::Settings timing;
    timing.breakdown = config_.wall_clock_breakdown;
    timing.steps_per_print = config_.steps_per_print.value_or(0);
    timing.main_process = is_main_process();
    timing.device = device_;
    step_timer_ = std::make_shared<detail::WallClockTimer>(timing);
    step_timer_->set_sink(
        [this](const std::map<std::string, double>& values, int64_t step) { log(values, step); });
  }
}

void Accelerator::resolve(int64_t micro_batch) {
  if (micro_batch > 0) {
    // The program's loader and the config must agree on the per-process
    // batch; one given in only one place is used.
    const std::optional<int64_t>& file_micro = file_config_.train_micro_batch_size_per_gpu;
    if (file_micro && *file_micro != micro_batch) {
      auto where = file_config_.key_locations.find("train_micro_batch_size_per_gpu");
      TANDEM_THROW(UsageError,
                   "train_micro_batch_size_per_gpu {} (from {}) disagrees with the data loader's "
                   "batch size {} (the program's prepare_data_loader): each process would train "
                   "on {}, not on {}. Make them agree: change one, or set the config's value to "
                   "\"auto\" so the loader decides",
                   *file_micro,
                   where != file_config_.key_locations.end() ? where->second
                   : file_config_.source_path.empty()         ? std::string("the config")
                                                              : file_config_.source_path,
                   micro_batch, micro_batch, *file_micro);
    }
    overrides_.train_micro_batch_size_per_gpu = micro_batch;
    overrides_.train_micro_batch_size_source = "the data loader's batch size";
  }
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

void Accelerator::backward(const at::Tensor& loss) {
  TANDEM_CHECK_ARG(loss.defined() && loss.numel() == 1,
                   "Accelerator::backward: the loss must be a scalar tensor, got shape {}",
                   loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
  if (step_timer_) step_timer_->before_backward();
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
  if (step_timer_) step_timer_->after_backward();
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

void Accelerator::clip_grad_value(double clip_value) {
  TANDEM_CHECK_ARG(clip_value > 0 && std::isfinite(clip_value),
                   "Accelerator::clip_grad_value: clip_value must be a positive finite number, "
                   "got {}",
                   clip_value);
  TANDEM_CHECK_ARG(!optimizers_.empty(),
                   "Accelerator::clip_grad_value: no optimizer is prepared; it clamps the "
                   "gradients of the prepared optimizers' parameters");
  if (!controller_->state().sync_gradients) return;
  for (const auto& optimizer : optimizers_) optimizer->core_->clip_value(*optimizer, clip_value);
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

WallClockBreakdown Accelerator::wall_clock() const {
  return step_timer_ ? step_timer_->last() : WallClockBreakdown{};
}

void Accelerator::end_training() {
  metrics_.close();
  tensorboard_.reset();
  wait_for_everyone();
}

}  // namespace tandem
