// Trackers (trackers.h): metrics to JSON lines and TensorBoard, and the
// step timer's reports.

#include "accelerate/trackers.h"

#include "tandem/core/error.h"

namespace tandem::detail {

Trackers::Trackers(Settings settings) : settings_(std::move(settings)) {
  for (const auto& tracker : settings_.log_with) {
    TANDEM_CHECK_ARG(tracker == "tensorboard" || tracker == "all",
                     "Accelerator: log_with '{}' is not available. tandem writes JSON lines "
                     "always and TensorBoard event files with log_with \"tensorboard\" (or "
                     "\"all\"); other trackers can read either",
                     tracker);
    tensorboard_wanted_ = true;
  }
}

// The prepared objects may outlive this: their timer must not call back.
Trackers::~Trackers() {
  if (timer_) timer_->set_sink(nullptr);
}

void Trackers::start_timer(const Config& config, c10::Device device) {
  if (!config.wall_clock_breakdown && !config.steps_per_print) return;
  WallClockTimer::Settings timing;
  timing.breakdown = config.wall_clock_breakdown;
  timing.steps_per_print = config.steps_per_print.value_or(0);
  timing.main_process = settings_.main_process;
  timing.device = device;
  timer_ = std::make_shared<WallClockTimer>(timing);
  timer_->set_sink(
      [this](const std::map<std::string, double>& values, int64_t step) { log(values, step); });
}

void Trackers::init(const std::string& path, const std::map<std::string, HParamValue>& config) {
  metrics_.open(path, settings_.main_process);
  tensorboard_.reset();
  if (!tensorboard_wanted_ || !settings_.main_process) return;
  std::string dir = settings_.project_dir;
  if (dir.empty()) {
    const auto slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  tensorboard_ = std::make_unique<TensorBoardWriter>(dir);
  if (!config.empty()) tensorboard_->add_hparams(config);
}

void Trackers::log(const std::map<std::string, double>& values, int64_t step) {
  metrics_.log(values, step);
  if (tensorboard_) {
    for (const auto& [tag, value] : values) tensorboard_->add_scalar(tag, value, step);
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
}

}  // namespace tandem::detail
