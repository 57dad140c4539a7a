// torch.cuda.amp.GradScaler's rule (torch's _amp_update_scale_).

#include <cmath>
#include <limits>

#include "tandem/amp/loss_scaler.h"

namespace tandem {
namespace {

bool is_positive_float(double value) {
  return std::isfinite(value) && value > 0 &&
         value <= static_cast<double>(std::numeric_limits<float>::max());
}

void check_options(const GradScalerOptions& o) {
  TANDEM_CHECK_ARG(is_positive_float(o.init_scale),
                   "GradScaler init_scale is {}; it must be a positive, finite float32 "
                   "(torch's default is 65536)",
                   o.init_scale);
  TANDEM_CHECK_ARG(std::isfinite(o.growth_factor) && o.growth_factor > 1.0,
                   "GradScaler growth_factor is {}; it must be > 1 (torch's default is 2)",
                   o.growth_factor);
  TANDEM_CHECK_ARG(o.backoff_factor > 0.0 && o.backoff_factor < 1.0,
                   "GradScaler backoff_factor is {}; it must be in (0, 1) (torch's default is "
                   "0.5)",
                   o.backoff_factor);
  TANDEM_CHECK_ARG(o.growth_interval >= 1,
                   "GradScaler growth_interval is {}; it must be >= 1 clean steps (torch's "
                   "default is 2000; fp16.loss_scale_window sets it)",
                   o.growth_interval);
  TANDEM_CHECK_ARG(std::isfinite(o.min_loss_scale) && o.min_loss_scale > 0,
                   "min_loss_scale is {}; it must be positive and finite (the default is 1)",
                   o.min_loss_scale);
}

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options)
    : LossScaler(options.min_loss_scale, options.max_overflows_at_min_scale),
      options_(options),
      scale_(static_cast<float>(options.init_scale)) {
  check_options(options_);
}

LossScaleRule GradScaler::rule() const {
  return options_.enabled ? LossScaleRule::kTorch : LossScaleRule::kDisabled;
}

double GradScaler::scale() const { return options_.enabled ? scale_ : 1.0; }

void GradScaler::update_scale(bool found_inf) {
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  const int64_t successful = growth_tracker_ + 1;
  if (successful == options_.growth_interval) {
    // torch keeps the scale in a float32 tensor and skips a growth that
    // would make it inf (torch 2.x; pytorch#98876).
    const float grown = static_cast<float>(scale_ * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    growth_tracker_ = successful;
  }
}

std::map<std::string, double> GradScaler::rule_state() const {
  return {{"scale", scale_},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)},
          {"growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::load_rule_state(const std::map<std::string, double>& state) {
  const double scale = state.at("scale");
  // 0 too: a run of overflows with the collapse check off underflows the
  // float32 scale to 0, as torch's does, and its own state must load back.
  TANDEM_CHECK_ARG(scale == 0.0 || is_positive_float(scale),
                   "GradScaler state_dict: scale is {}; expected a finite float32, 0 or more",
                   scale);
  GradScalerOptions loaded = options_;
  loaded.growth_factor = state.at("growth_factor");
  loaded.backoff_factor = state.at("backoff_factor");
  const double interval = state.at("growth_interval");
  const double tracker = state.at("growth_tracker");
  TANDEM_CHECK_ARG(interval == std::floor(interval) && interval >= 1 && interval <= 1e15,
                   "GradScaler state_dict: growth_interval is {}; expected a whole number >= 1",
                   interval);
  loaded.growth_interval = static_cast<int64_t>(interval);
  check_options(loaded);
  TANDEM_CHECK_ARG(tracker == std::floor(tracker) && tracker >= 0 &&
                       tracker < static_cast<double>(loaded.growth_interval),
                   "GradScaler state_dict: growth_tracker is {}; expected a whole number in "
                   "[0, growth_interval {})",
                   tracker, loaded.growth_interval);
  options_ = loaded;
  scale_ = static_cast<float>(scale);
  growth_tracker_ = static_cast<int64_t>(tracker);
}

}  // namespace tandem
