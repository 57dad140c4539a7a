// Trackers (trackers.h): metrics to JSON lines and TensorBoard, and the
// step timer's reports.

#include "accelerate/trackers.h"

#include "tandem/core/error.h"

namespace tandem::detail {

Trackers::Trackers(Settings settings) : settings_(std::move(settings)) {
  for (const auto& tracker : settings_.log_with) {
    TANDEM_CHECK_ARG(tracker == "tensorboard" || tracker == "csv" || tracker == "all",
                     "Accelerator: log_with '{}' is not available. tandem writes JSON lines "
                     "always, TensorBoard event files with log_with \"tensorboard\" and CSV "
                     "files (DeepSpeed's csv_monitor layout) with \"csv\" (\"all\": both); "
                     "other trackers can read them",
                     tracker);
    tensorboard_wanted_ = tensorboard_wanted_ || tracker != "csv";
    csv_wanted_ = csv_wanted_ || tracker != "tensorboard";
  }
}

// The prepared objects may outlive this: their timer must not call back.
Trackers::~Trackers() {
  if (timer_) timer_->set_sink(nullptr);
}

void Trackers::start_timer(const Config& config, c10::Device device,
                           std::function<int64_t()> samples_per_step) {
  monitors_on_ = config.tensorboard.enabled || config.csv_monitor.enabled;
  fp16_ = config.mixed_precision == MixedPrecision::kFp16;
  samples_per_step_ = std::move(samples_per_step);
  if (monitors_on_ && settings_.main_process) {
    if (config.tensorboard.enabled) {
      monitor_tensorboard_ = std::make_unique<TensorBoardWriter>(config.tensorboard.dir());
    }
    if (config.csv_monitor.enabled) {
      monitor_csv_ = std::make_unique<CsvWriter>(config.csv_monitor.dir());
    }
  }
  if (!config.wall_clock_breakdown && !config.steps_per_print && !monitors_on_) return;
  WallClockTimer::Settings timing;
  timing.breakdown = config.wall_clock_breakdown;
  timing.steps_per_print = config.steps_per_print.value_or(0);
  timing.main_process = settings_.main_process;
  timing.device = device;
  timer_ = std::make_shared<WallClockTimer>(timing);
  timer_->set_sink(
      [this](const std::map<std::string, double>& values, int64_t step) { log(values, step); });
  if (monitors_on_) {
    timer_->set_step_observer(
        [this](int64_t step, const std::vector<double>& learning_rates, double scale) {
          write_monitor_events(step, learning_rates, scale);
        });
  }
}

void Trackers::add_loss(double loss) {
  loss_sum_ += loss;
  ++losses_;
}

// DeepSpeed's engine: after each optimizer step, at global_samples (steps x
// the global batch), Train/Samples/train_loss (the mean of the step's
// micro-step losses, this process's), Train/Samples/lr (the first param
// group's) and, under fp16, Train/Samples/loss_scale.
void Trackers::write_monitor_events(int64_t step, const std::vector<double>& learning_rates,
                                    double loss_scale) {
  std::map<std::string, double> events;
  if (losses_ > 0) events["Train/Samples/train_loss"] = loss_sum_ / static_cast<double>(losses_);
  loss_sum_ = 0;
  losses_ = 0;
  if (!learning_rates.empty()) events["Train/Samples/lr"] = learning_rates.front();
  if (fp16_) events["Train/Samples/loss_scale"] = loss_scale;
  const int64_t samples = step * (samples_per_step_ ? samples_per_step_() : 1);
  for (const auto& [tag, value] : events) {
    if (monitor_tensorboard_) monitor_tensorboard_->add_scalar(tag, value, samples);
    if (monitor_csv_) monitor_csv_->add_scalar(tag, value, samples);
  }
}

void Trackers::init(const std::string& path, const std::map<std::string, HParamValue>& config) {
  metrics_.open(path, settings_.main_process);
  tensorboard_.reset();
  csv_.reset();
  if (!settings_.main_process) return;
  std::string dir = settings_.project_dir;
  if (dir.empty()) {
    const auto slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  if (tensorboard_wanted_) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(dir);
    if (!config.empty()) tensorboard_->add_hparams(config);
  }
  if (csv_wanted_) csv_ = std::make_unique<CsvWriter>(dir);
}

void Trackers::log(const std::map<std::string, double>& values, int64_t step) {
  metrics_.log(values, step);
  for (const auto& [tag, value] : values) {
    if (tensorboard_) tensorboard_->add_scalar(tag, value, step);
    if (csv_) csv_->add_scalar(tag, value, step);
    // The DeepSpeed monitors get what the program logs too, as DeepSpeed's
    // engine.monitor.write_events does.
    if (monitor_tensorboard_) monitor_tensorboard_->add_scalar(tag, value, step);
    if (monitor_csv_) monitor_csv_->add_scalar(tag, value, step);
  }
}

WallClockBreakdown Trackers::wall_clock() const {
  return timer_ ? timer_->last() : WallClockBreakdown{};
}

ProgressBar Trackers::progress_bar(int64_t total, std::string description) const {
  return ProgressBar(total, std::move(description), settings_.local_main_process);
}

void Trackers::close() {
  metrics_.close();
  tensorboard_.reset();
  csv_.reset();
  monitor_tensorboard_.reset();
  monitor_csv_.reset();
}

}  // namespace tandem::detail
