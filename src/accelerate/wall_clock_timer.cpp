#include "accelerate/wall_clock_timer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "accelerate/model_strategy.h"
#include "core/torch_compat_memory.h"
#include "tandem/core/logging.h"

namespace tandem::detail {

WallClockTimer::WallClockTimer(Settings settings) : settings_(settings) { restart_forward(); }

void WallClockTimer::add_model(std::shared_ptr<ModelStrategy> model) {
  if (!settings_.breakdown) return;
  model->time_communication();
  models_.push_back(std::move(model));
  restart_forward();
}

WallClockTimer::Clock::time_point WallClockTimer::read() {
  compat::synchronize_device(settings_.device);
  return Clock::now();
}

double WallClockTimer::communication_seconds() const {
  double total = 0;
  for (const auto& model : models_) total += model->communication_wait_seconds();
  return total;
}

void WallClockTimer::restart_forward() {
  if (!settings_.breakdown || started_) return;
  forward_from_ = read();
  communication_at_ = communication_seconds();
}

void WallClockTimer::before_backward() {
  if (!settings_.breakdown) return;
  backward_from_ = read();
  forward_ += std::chrono::duration<double>(backward_from_ - forward_from_).count();
  started_ = true;
}

void WallClockTimer::after_backward() {
  if (!settings_.breakdown) return;
  forward_from_ = read();
  backward_ += std::chrono::duration<double>(forward_from_ - backward_from_).count();
}

void WallClockTimer::before_step() {
  if (!settings_.breakdown) return;
  // What ran since the last backward (clip_grad_norm(), logging) is in
  // none of the parts.
  step_from_ = read();
}

void WallClockTimer::after_step(int64_t step, bool advanced, int64_t skipped,
                                const std::function<std::vector<double>()>& learning_rates,
                                double loss_scale) {
  if (settings_.breakdown) {
    forward_from_ = read();
    const double communication = communication_seconds();
    window_forward_ += forward_;
    window_backward_ += backward_;
    window_step_ += std::chrono::duration<double>(forward_from_ - step_from_).count();
    window_communication_ += communication - communication_at_;
    communication_at_ = communication;
    forward_ = backward_ = 0;
    started_ = true;
  }
  if (!advanced) return;
  if (observer_) observer_(step, learning_rates(), loss_scale);
  ++window_steps_;
  const int64_t period =
      settings_.steps_per_print > 0 ? settings_.steps_per_print : kDefaultWindow;
  if (step % period != 0) return;
  if (settings_.steps_per_print > 0 && settings_.main_process) {
    // DeepSpeed's progress line, with the loss scale in place of momentum.
    log_info("step={}, skipped={}, lr=[{}], loss_scale={}", step, skipped,
             fmt::join(learning_rates(), ", "), loss_scale);
  }
  if (settings_.breakdown) report(step);
}

void WallClockTimer::report(int64_t step) {
  const double per_step_ms = 1000.0 / static_cast<double>(window_steps_);
  last_.step = step;
  last_.steps = window_steps_;
  last_.forward_ms = window_forward_ * per_step_ms;
  last_.backward_ms = window_backward_ * per_step_ms;
  last_.step_ms = window_step_ * per_step_ms;
  last_.communication_ms = window_communication_ * per_step_ms;
  window_forward_ = window_backward_ = window_step_ = window_communication_ = 0;
  window_steps_ = 0;
  if (settings_.main_process) {
    log_info("time (ms) | fwd: {:.2f} | bwd: {:.2f} | step: {:.2f} | comm: {:.2f}",
             last_.forward_ms, last_.backward_ms, last_.step_ms, last_.communication_ms);
  }
  if (sink_) {
    sink_({{"wall_clock/forward_ms", last_.forward_ms},
           {"wall_clock/backward_ms", last_.backward_ms},
           {"wall_clock/step_ms", last_.step_ms},
           {"wall_clock/communication_ms", last_.communication_ms}},
          step);
  }
}

}  // namespace tandem::detail
