#pragma once
// WallClockTimer: DeepSpeed's wall_clock_breakdown and steps_per_print for
// the Accelerator. The Accelerator and its prepared optimizers share one
// timer (none when both keys are off, so training reads no clock) and call
// it at the edges of each part of a step:
//
//   restart_forward   a prepared optimizer's zero_grad() before the first
//                     backward (also construction and add_model): the first
//                     step's forward region starts at the last of them
//   before_backward   Accelerator::backward() begins (the forward region
//                     ends)
//   after_backward    it returns (the next micro-step's forward region
//                     starts)
//   before_step       a synchronising step() of a prepared optimizer begins
//   after_step        it ended (taken or skipped): the step is closed, and
//                     when Accelerator::step() reached a multiple of
//                     steps_per_print the window is reported
//
// The public WallClockBreakdown (tandem/accelerate/wall_clock.h) says what
// each part covers. On CUDA the device is synchronised before every reading,
// as DeepSpeed's timers do, so kernels are counted in the part that queued
// them.
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "tandem/accelerate/wall_clock.h"

namespace tandem::detail {

class ModelStrategy;

class WallClockTimer {
 public:
  struct Settings {
    bool breakdown = false;  // wall_clock_breakdown: time the parts of each step
    // steps_per_print when given (0: not given). It paces the progress line
    // and the breakdown's window (kDefaultWindow steps when not given).
    int64_t steps_per_print = 0;
    bool main_process = false;  // the lines are logged here only
    c10::Device device = c10::Device(c10::kCPU);
  };
  static constexpr int64_t kDefaultWindow = 10;

  // What the breakdown reports to, besides the log: the Accelerator's
  // trackers (Accelerator::log).
  using Sink = std::function<void(const std::map<std::string, double>& values, int64_t step)>;

  explicit WallClockTimer(Settings settings);

  bool breakdown() const { return settings_.breakdown; }
  // The trackers; an empty function detaches them (the Accelerator is gone).
  void set_sink(Sink sink) { sink_ = std::move(sink); }
  // Called after every step that advanced, with the step, the stepped
  // optimizer's learning rates and the loss scale (the DeepSpeed monitors').
  using StepObserver =
      std::function<void(int64_t step, const std::vector<double>& learning_rates, double scale)>;
  void set_step_observer(StepObserver observer) { observer_ = std::move(observer); }
  // A prepared model, whose communication waits count in communication_ms
  // (turns its measurement on when the breakdown is).
  void add_model(std::shared_ptr<ModelStrategy> model);

  void restart_forward();
  void before_backward();
  void after_backward();
  void before_step();
  // `step` is Accelerator::step() after the step and `advanced` whether the
  // step made it grow; `skipped` the loss scaler's skipped steps so far;
  // `learning_rates` gives the stepped optimizer's, per param group (called
  // only for the progress line); `loss_scale` the next backward's.
  void after_step(int64_t step, bool advanced, int64_t skipped,
                  const std::function<std::vector<double>()>& learning_rates,
                  double loss_scale);

  // The last window's averages (all zero before the first closes).
  const WallClockBreakdown& last() const { return last_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Now, once the device's queued work has finished.
  Clock::time_point read();
  double communication_seconds() const;
  void report(int64_t step);

  Settings settings_;
  StepObserver observer_;
  Sink sink_;
  std::vector<std::shared_ptr<ModelStrategy>> models_;
  bool started_ = false;  // a backward ran: zero_grad() no longer restarts the forward region
  Clock::time_point forward_from_;
  Clock::time_point backward_from_;
  Clock::time_point step_from_;
  double communication_at_ = 0;  // communication_seconds() when the current step began
  // The current step's parts, then the window's sums (seconds).
  double forward_ = 0, backward_ = 0;
  double window_forward_ = 0, window_backward_ = 0, window_step_ = 0, window_communication_ = 0;
  int64_t window_steps_ = 0;  // Accelerator steps in the window
  WallClockBreakdown last_;
};

}  // namespace tandem::detail
