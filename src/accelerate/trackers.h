#pragma once
// Trackers: where an Accelerator's metrics and step times go. It owns the
// JSON-lines logger, the TensorBoard, CSV and MLflow writers
// (AcceleratorOptions::log_with) and the wall-clock timer (wall_clock_breakdown / steps_per_print), whose
// window reports it logs. Behind Accelerator::init_trackers, log,
// wall_clock, progress_bar and end_training.
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accelerate/wall_clock_timer.h"
#include "tandem/accelerate/csv_writer.h"
#include "tandem/accelerate/metrics_logger.h"
#include "tandem/accelerate/mlflow_writer.h"
#include "tandem/accelerate/progress_bar.h"
#include "tandem/accelerate/tensorboard_writer.h"
#include "tandem/accelerate/wall_clock.h"
#include "tandem/config/config.h"

namespace tandem::detail {

// MLflow's experiment for init_trackers(path) when none is named: the file
// name's stem, up to its last dot ("runs/gpt.v2.jsonl": "gpt.v2", "runs/gpt":
// "gpt"); empty for ".jsonl" or "runs/".
std::string mlflow_experiment_of(const std::string& path);

class Trackers {
 public:
  struct Settings {
    std::vector<std::string> log_with;  // AcceleratorOptions::log_with
    std::string project_dir;            // TensorBoard's directory (empty: the log's)
    MlflowOptions mlflow;               // AcceleratorOptions::mlflow
    bool main_process = false;          // writes the trackers
    bool local_main_process = false;    // draws progress bars
  };
  // UsageError for a log_with tracker that is not available.
  explicit Trackers(Settings settings);
  // The timer the prepared objects share stops reporting here.
  ~Trackers();
  Trackers(const Trackers&) = delete;
  Trackers& operator=(const Trackers&) = delete;

  // Starts the step timer when the config asks for wall_clock_breakdown,
  // steps_per_print or a DeepSpeed monitor (else there is none, and no clock
  // is read), and opens the config's DeepSpeed monitors (tensorboard,
  // csv_monitor) on the main process. `samples_per_step`: the global batch,
  // the monitors' step unit (DeepSpeed's global_samples).
  void start_timer(const Config& config, c10::Device device,
                   std::function<int64_t()> samples_per_step);
  // The loss of one micro-step, for the monitors' Train/Samples/train_loss
  // (the mean over the optimizer step's micro-steps). Only when one is on.
  bool wants_losses() const { return monitors_on_; }
  void add_loss(double loss);
  // The timer the backward and prepared optimizers report to (null: off).
  const std::shared_ptr<WallClockTimer>& timer() const { return timer_; }

  // Accelerator::init_trackers: JSON lines in `path`, TensorBoard events
  // beside it (or in the project dir) with the hyperparameters `config`,
  // and an MLflow run (experiment: the options', else `path`'s stem; a
  // warning when the stem is empty). A DeepSpeed monitor (start_timer)
  // whose folder is the same as the tensorboard or csv tracker's is that
  // tracker: one writer, each value written once.
  void init(const std::string& path, const std::map<std::string, HParamValue>& config);
  // Accelerator::load_state: the run resumed at optimizer step `step`. The
  // JSON lines file (now or at init) keeps its lines up to it
  // (MetricsLogger::resume_from).
  void resumed(int64_t step);
  void log(const std::map<std::string, double>& values, int64_t step);
  // Accelerate's get_tracker: "tensorboard" (null before init_trackers or
  // off), "csv", "mlflow"; UsageError for another name.
  TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }
  CsvWriter* csv() const { return csv_.get(); }
  MlflowWriter* mlflow() const { return mlflow_.get(); }
  WallClockBreakdown wall_clock() const;
  ProgressBar progress_bar(int64_t total, std::string description) const;
  // Flushes and closes the trackers (an MLflow run ends FINISHED; when its
  // server cannot take the last metrics, a warning says so).
  void close();

 private:
  Settings settings_;
  // DeepSpeed's Train/Samples/* events after an optimizer step.
  void write_monitor_events(int64_t step, const std::vector<double>& learning_rates,
                            double loss_scale);

  bool tensorboard_wanted_ = false;
  bool csv_wanted_ = false;
  bool mlflow_wanted_ = false;
  MetricsLogger metrics_;
  std::optional<int64_t> resumed_step_;
  // Shared with the monitor of the same kind when both write one folder.
  std::shared_ptr<TensorBoardWriter> tensorboard_;
  std::shared_ptr<CsvWriter> csv_;
  std::unique_ptr<MlflowWriter> mlflow_;
  // The DeepSpeed monitors' own writers (output_path/job_name).
  bool monitors_on_ = false;
  bool fp16_ = false;
  std::function<int64_t()> samples_per_step_;
  std::shared_ptr<TensorBoardWriter> monitor_tensorboard_;
  std::string monitor_tensorboard_dir_;
  std::shared_ptr<CsvWriter> monitor_csv_;
  double loss_sum_ = 0;
  int64_t losses_ = 0;
  std::shared_ptr<WallClockTimer> timer_;
};

}  // namespace tandem::detail
