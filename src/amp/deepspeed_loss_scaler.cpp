// DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/
// loss_scaler.py), with hysteresis ("delayed_shift") and a minimum scale.

#include <algorithm>
#include <cmath>

#include "tandem/amp/loss_scaler.h"

namespace tandem {
namespace {

// DeepSpeed's factor; its fp16 block has no key for it.
constexpr double kScaleFactor = 2.0;
// DeepSpeed's fp16.loss_scale_window default.
constexpr int64_t kDeepSpeedScaleWindow = 1000;

const LossScaleConfig& checked(const LossScaleConfig& c) {
  TANDEM_CHECK_ARG(c.loss_scale == 0,
                   "fp16.loss_scale is {}: that is a static scale; DeepSpeed's dynamic scaler "
                   "needs loss_scale 0 (use StaticLossScaler or make_loss_scaler)",
                   c.loss_scale);
  TANDEM_CHECK_ARG(c.initial_scale_power >= 0 && c.initial_scale_power <= 1000,
                   "fp16.initial_scale_power is {}; use 0..1000 (the default is 16)",
                   c.initial_scale_power);
  TANDEM_CHECK_ARG(c.loss_scale_window.value_or(1) >= 1,
                   "fp16.loss_scale_window is {}; it must be >= 1 clean steps (the default is "
                   "1000)",
                   c.loss_scale_window.value_or(1));
  TANDEM_CHECK_ARG(c.hysteresis >= 1,
                   "fp16.hysteresis is {}; it must be >= 1 (the default is 2)", c.hysteresis);
  TANDEM_CHECK_ARG(std::isfinite(c.min_loss_scale) && c.min_loss_scale > 0,
                   "fp16.min_loss_scale is {}; it must be positive and finite (the default is "
                   "1)",
                   c.min_loss_scale);
  return c;
}

}  // namespace

DeepSpeedLossScaler::DeepSpeedLossScaler(const LossScaleConfig& config,
                                         int64_t max_overflows_at_min_scale)
    : LossScaler(checked(config).min_loss_scale, max_overflows_at_min_scale),
      config_(config),
      window_(config.loss_scale_window.value_or(kDeepSpeedScaleWindow)),
      scale_(std::ldexp(1.0, config.initial_scale_power)),
      cur_hysteresis_(config.hysteresis) {}

LossScaleRule DeepSpeedLossScaler::rule() const { return LossScaleRule::kDeepSpeed; }

double DeepSpeedLossScaler::scale() const { return scale_; }

void DeepSpeedLossScaler::update_scale(bool found_inf) {
  if (found_inf) {
    if (config_.hysteresis == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / kScaleFactor, config_.min_loss_scale);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
    // DeepSpeed 0.19.8: the clean steps since the last overflow, not
    // counting this one, must be a positive multiple of the window.
    const int64_t stable_interval = cur_iter_ - last_overflow_iter_ - 1;
    if (stable_interval > 0 && stable_interval % window_ == 0) {
      if (!config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
      scale_ *= kScaleFactor;
    }
  }
  ++cur_iter_;
}

std::map<std::string, double> DeepSpeedLossScaler::rule_state() const {
  return {{"scale", scale_},
          {"cur_iter", static_cast<double>(cur_iter_)},
          {"last_overflow_iter", static_cast<double>(last_overflow_iter_)},
          {"cur_hysteresis", static_cast<double>(cur_hysteresis_)}};
}

void DeepSpeedLossScaler::load_rule_state(const std::map<std::string, double>& state) {
  const double scale = state.at("scale");
  const double iter = state.at("cur_iter");
  const double last = state.at("last_overflow_iter");
  const double hysteresis = state.at("cur_hysteresis");
  auto whole = [](double v) { return std::isfinite(v) && v == std::floor(v) && v <= 1e15; };
  TANDEM_CHECK_ARG(std::isfinite(scale) && scale > 0,
                   "DeepSpeed loss scaler state_dict: scale is {}; expected a positive, finite "
                   "number",
                   scale);
  TANDEM_CHECK_ARG(whole(iter) && whole(last) && iter >= 0 && last >= -1 && last < iter,
                   "DeepSpeed loss scaler state_dict: cur_iter {} and last_overflow_iter {} "
                   "must be whole numbers with -1 <= last_overflow_iter < cur_iter",
                   iter, last);
  TANDEM_CHECK_ARG(whole(hysteresis) && hysteresis >= 1 && hysteresis <= config_.hysteresis,
                   "DeepSpeed loss scaler state_dict: cur_hysteresis is {}; expected 1..{} "
                   "(fp16.hysteresis)",
                   hysteresis, config_.hysteresis);
  scale_ = scale;
  cur_iter_ = static_cast<int64_t>(iter);
  last_overflow_iter_ = static_cast<int64_t>(last);
  cur_hysteresis_ = static_cast<int>(hysteresis);
}

}  // namespace tandem
