// Trackers (trackers.h): metrics to JSON lines, TensorBoard, CSV and
// MLflow, and the step timer's reports.

#include "accelerate/trackers.h"

#include <cstdlib>

#include <fmt/format.h>

#include "core/http_client.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

// A hyperparameter as Python's str() writes it, the text MLflow keeps for a
// parameter: whole numbers without ".0" (they are ints in a C++ program),
// others the shortest round trip; True/False.
std::string param_text(const HParamValue& value) {
  switch (value.kind()) {
    case HParamValue::Kind::kBool:
      return value.flag() ? "True" : "False";
    case HParamValue::Kind::kString:
      return value.text();
    case HParamValue::Kind::kNumber:
      break;
  }
  const double number = value.number();
  if (number == static_cast<double>(static_cast<int64_t>(number)) && std::abs(number) < 1e15) {
    return std::to_string(static_cast<int64_t>(number));
  }
  return fmt::format("{}", number);
}

// Whether two folders are one: both made absolute and normalised (symbolic
// links are not followed).
bool same_folder(const std::string& a, const std::string& b) {
  auto normal = [](const std::string& dir) {
    std::string path = fs::absolute(dir.empty() ? "." : dir);
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    return path;
  };
  return normal(a) == normal(b);
}

}  // namespace

std::string mlflow_experiment_of(const std::string& path) {
  const std::string file = path.substr(path.rfind('/') + 1);
  const auto dot = file.rfind('.');
  return dot == std::string::npos ? file : file.substr(0, dot);
}

Trackers::Trackers(Settings settings) : settings_(std::move(settings)) {
  const std::string mlflow_uri = mlflow_options_from_environment(settings_.mlflow).tracking_uri;
  for (const auto& tracker : settings_.log_with) {
    TANDEM_CHECK_ARG(tracker == "tensorboard" || tracker == "csv" || tracker == "mlflow" ||
                         tracker == "all",
                     "Accelerator: log_with '{}' is not available. tandem writes JSON lines "
                     "always, and with log_with \"tensorboard\" TensorBoard event files, "
                     "\"csv\" CSV files (DeepSpeed's csv_monitor layout), \"mlflow\" a run on "
                     "an MLflow tracking server (\"all\": each of them; MLflow when "
                     "MLFLOW_TRACKING_URI is set); other trackers can read the files",
                     tracker);
    const bool all = tracker == "all";
    tensorboard_wanted_ = tensorboard_wanted_ || all || tracker == "tensorboard";
    csv_wanted_ = csv_wanted_ || all || tracker == "csv";
    mlflow_wanted_ = mlflow_wanted_ || tracker == "mlflow" ||
                     (all && !mlflow_uri.empty());
  }
  // On every rank, before any work: a run asking for MLflow without a
  // server it can reach stops here, not later on the main process alone.
  if (mlflow_wanted_) {
    TANDEM_CHECK_ARG(!mlflow_uri.empty(),
                     "Accelerator: log_with \"mlflow\" needs a tracking server: set "
                     "MLFLOW_TRACKING_URI=http://HOST:PORT (or AcceleratorOptions::mlflow."
                     "tracking_uri) to a running `mlflow server`, or leave \"mlflow\" out");
    (void)HttpUrl::parse(mlflow_uri, "MLFLOW_TRACKING_URI");
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
      monitor_tensorboard_dir_ = config.tensorboard.dir();
      monitor_tensorboard_ = std::make_shared<TensorBoardWriter>(monitor_tensorboard_dir_);
    }
    if (config.csv_monitor.enabled) {
      monitor_csv_ = std::make_shared<CsvWriter>(config.csv_monitor.dir());
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
  if (resumed_step_) metrics_.resume_from(*resumed_step_);
  tensorboard_.reset();
  csv_.reset();
  if (!settings_.main_process) return;
  std::string dir = settings_.project_dir;
  if (dir.empty()) {
    const auto slash = path.rfind('/');
    dir = slash == std::string::npos ? "." : path.substr(0, slash);
  }
  // A DeepSpeed monitor writing to the same folder is the same tracker: one
  // writer, so that each value lands there once (one event file, one CSV
  // file per tag).
  if (tensorboard_wanted_) {
    tensorboard_ = monitor_tensorboard_ && same_folder(monitor_tensorboard_dir_, dir)
                       ? monitor_tensorboard_
                       : std::make_shared<TensorBoardWriter>(dir);
    if (!config.empty()) tensorboard_->add_hparams(config);
  }
  if (csv_wanted_) {
    csv_ = monitor_csv_ && same_folder(monitor_csv_->dir(), dir) ? monitor_csv_
                                                                 : std::make_shared<CsvWriter>(dir);
  }
  mlflow_.reset();
  if (mlflow_wanted_) {
    // Accelerate names the experiment after init_trackers' project_name;
    // here that is the log file's stem ("runs/gpt.v2.jsonl": gpt.v2).
    MlflowOptions options = mlflow_options_from_environment(settings_.mlflow);
    if (options.experiment_name.empty() && std::getenv("MLFLOW_EXPERIMENT_ID") == nullptr) {
      options.experiment_name = mlflow_experiment_of(path);
      if (options.experiment_name.empty()) {
        log_warn("init_trackers(\"{}\"): the file name has no stem to name the MLflow "
                 "experiment, so the run goes to MLflow's \"Default\" experiment. Name the "
                 "file (runs/gpt.jsonl: experiment \"gpt\") or set AcceleratorOptions::"
                 "mlflow.experiment_name or MLFLOW_EXPERIMENT_NAME",
                 path);
      }
    }
    mlflow_ = std::make_unique<MlflowWriter>(std::move(options));
    std::map<std::string, std::string> params;
    for (const auto& [key, value] : config) params.emplace(key, param_text(value));
    if (!params.empty()) mlflow_->log_params(params);
  }
}

void Trackers::resumed(int64_t step) {
  resumed_step_ = step;
  metrics_.resume_from(step);
}

void Trackers::log(const std::map<std::string, double>& values, int64_t step) {
  metrics_.log(values, step);
  if (mlflow_) mlflow_->log_metrics(values, step);
  for (const auto& [tag, value] : values) {
    if (tensorboard_) tensorboard_->add_scalar(tag, value, step);
    if (csv_) csv_->add_scalar(tag, value, step);
    // The DeepSpeed monitors get what the program logs too, as DeepSpeed's
    // engine.monitor.write_events does (once, when one is log_with's own).
    if (monitor_tensorboard_ && monitor_tensorboard_ != tensorboard_) {
      monitor_tensorboard_->add_scalar(tag, value, step);
    }
    if (monitor_csv_ && monitor_csv_ != csv_) monitor_csv_->add_scalar(tag, value, step);
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
  if (mlflow_) {
    try {
      mlflow_->finish();
    } catch (const UsageError& e) {
      log_warn("{} (the JSON lines file has every metric)", e.what());
    }
    mlflow_.reset();
  }
  tensorboard_.reset();
  csv_.reset();
  monitor_tensorboard_.reset();
  monitor_csv_.reset();
}

}  // namespace tandem::detail
