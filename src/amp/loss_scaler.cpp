// The scaler base: step counting, the collapse check and the checkpoint
// format shared by every rule, and the factory.

#include "tandem/amp/loss_scaler.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/text.h"

namespace tandem {
namespace {

constexpr const char* kRuleKey = "rule";
constexpr const char* kStepsKey = "steps";
constexpr const char* kSkippedKey = "skipped_steps";
constexpr const char* kOverflowsKey = "overflows_at_min_scale";

// A saved counter: a whole number in [minimum, 2^53] (doubles are exact there).
int64_t counter_value(const std::map<std::string, double>& state, const char* key,
                      int64_t minimum) {
  const double value = state.at(key);
  TANDEM_CHECK_ARG(std::isfinite(value) && value == std::floor(value) && value >= minimum &&
                       value <= 9007199254740992.0,
                   "loss scaler state_dict: '{}' is {}; expected a whole number >= {}", key,
                   value, minimum);
  return static_cast<int64_t>(value);
}

}  // namespace

const char* to_string(LossScaleRule rule) {
  switch (rule) {
    case LossScaleRule::kDisabled: return "disabled";
    case LossScaleRule::kStatic: return "static";
    case LossScaleRule::kTorch: return "torch";
    case LossScaleRule::kDeepSpeed: return "deepspeed";
  }
  return "unknown";
}

LossScaler::LossScaler(double min_loss_scale, int64_t max_overflows_at_min_scale)
    : min_loss_scale_(min_loss_scale), max_overflows_at_min_scale_(max_overflows_at_min_scale) {
  TANDEM_CHECK_ARG(max_overflows_at_min_scale >= 0,
                   "max_overflows_at_min_scale is {}; use a count >= 1, or 0 to turn the "
                   "scale-collapse check off",
                   max_overflows_at_min_scale);
}

LossScaler::~LossScaler() = default;

bool LossScaler::update(bool found_inf) {
  ++steps_;
  if (!enabled()) return false;
  const double attempted = scale();
  update_scale(found_inf);
  if (!found_inf) {
    overflows_at_min_scale_ = 0;
    return false;
  }
  ++skipped_steps_;
  overflows_at_min_scale_ = attempted <= min_loss_scale_ ? overflows_at_min_scale_ + 1 : 0;
  if (max_overflows_at_min_scale_ > 0 && overflows_at_min_scale_ >= max_overflows_at_min_scale_) {
    throw_collapse(attempted);
  }
  return true;
}

void LossScaler::throw_collapse(double attempted_scale) const {
  const int64_t first = steps_ - overflows_at_min_scale_ + 1;
  if (rule() == LossScaleRule::kStatic) {
    TANDEM_THROW(ScaleCollapseError,
                 "fp16 training is stuck: optimizer steps {}..{} ({} in a row) all overflowed "
                 "(inf/NaN gradients) at the static loss scale {}, which cannot adapt, so every "
                 "step is being skipped. Fixes: 1) use dynamic loss scaling (fp16.loss_scale: "
                 "0); 2) a lower fp16.loss_scale; 3) mixed_precision: bf16, whose range is "
                 "fp32's; 4) a lower learning rate or gradient_clipping if the loss itself "
                 "diverges",
                 first, steps_, overflows_at_min_scale_, attempted_scale);
  }
  TANDEM_THROW(ScaleCollapseError,
               "fp16 loss scale collapsed: optimizer steps {}..{} ({} in a row) all overflowed "
               "(inf/NaN gradients) with the loss scale at or below min_loss_scale ({}; the "
               "last step ran at {}). The gradients overflow even without amplification, so "
               "the model itself produces inf/NaN in fp16 and lowering the scale cannot help "
               "(DeepSpeed stops here with 'Current loss scale already at minimum'). Likely "
               "causes: a learning rate too high (the loss diverged), or activations beyond "
               "fp16's range (65504). Fixes: 1) mixed_precision: bf16, whose range is fp32's; "
               "2) a lower learning rate or a longer warmup; 3) gradient_clipping (e.g. 1.0); "
               "4) check the inputs and the loss for inf/NaN; 5) only if the gradients are "
               "tiny rather than infinite, a lower fp16.min_loss_scale",
               first, steps_, overflows_at_min_scale_, min_loss_scale_, attempted_scale);
}

std::map<std::string, double> LossScaler::state_dict() const {
  std::map<std::string, double> state = rule_state();
  state[kRuleKey] = static_cast<double>(static_cast<int>(rule()));
  state[kStepsKey] = static_cast<double>(steps_);
  state[kSkippedKey] = static_cast<double>(skipped_steps_);
  state[kOverflowsKey] = static_cast<double>(overflows_at_min_scale_);
  return state;
}

void LossScaler::load_state_dict(const std::map<std::string, double>& state) {
  const std::map<std::string, double> own = rule_state();
  std::set<std::string> expected = {kRuleKey, kStepsKey, kSkippedKey, kOverflowsKey};
  for (const auto& entry : own) expected.insert(entry.first);
  std::set<std::string> missing;
  std::set<std::string> unknown;
  for (const auto& key : expected) {
    if (!state.count(key)) missing.insert(key);
  }
  for (const auto& entry : state) {
    if (!expected.count(entry.first)) unknown.insert(entry.first);
  }
  // The rule first: a checkpoint of another scaler has other keys, and
  // naming the rules says more than listing them.
  if (state.count(kRuleKey)) {
    const double saved = state.at(kRuleKey);
    const double mine = static_cast<double>(static_cast<int>(rule()));
    if (saved != mine) {
      const bool known = saved == 0 || saved == 1 || saved == 2 || saved == 3;
      TANDEM_THROW(UsageError,
                   "loss scaler state_dict was saved by a '{}' scaler but this one is '{}'; "
                   "resume with the same mixed_precision and fp16 settings (loss_scale, "
                   "deepspeed_semantics) as the run that saved it",
                   known ? to_string(static_cast<LossScaleRule>(static_cast<int>(saved)))
                         : "unknown",
                   to_string(rule()));
    }
  }
  TANDEM_CHECK_ARG(missing.empty() && unknown.empty(),
                   "loss scaler state_dict for a '{}' scaler: missing keys {}, unknown keys {}; "
                   "pass a state_dict() of the same kind of scaler",
                   to_string(rule()), detail::quoted_keys(missing), detail::quoted_keys(unknown));

  const int64_t steps = counter_value(state, kStepsKey, 0);
  const int64_t skipped = counter_value(state, kSkippedKey, 0);
  const int64_t overflows = counter_value(state, kOverflowsKey, 0);
  TANDEM_CHECK_ARG(skipped <= steps && overflows <= skipped,
                   "loss scaler state_dict: skipped_steps ({}) and overflows_at_min_scale ({}) "
                   "cannot exceed steps ({})",
                   skipped, overflows, steps);
  std::map<std::string, double> rule_part;
  for (const auto& entry : own) rule_part[entry.first] = state.at(entry.first);
  load_rule_state(rule_part);  // validates before it changes anything
  steps_ = steps;
  skipped_steps_ = skipped;
  overflows_at_min_scale_ = overflows;
}

std::unique_ptr<LossScaler> make_loss_scaler(const LossScaleConfig& config,
                                             MixedPrecision precision,
                                             int64_t max_overflows_at_min_scale) {
  if (precision != MixedPrecision::kFp16) {
    GradScalerOptions options;
    options.enabled = false;
    return std::make_unique<GradScaler>(options);
  }
  if (config.loss_scale > 0) {
    return std::make_unique<StaticLossScaler>(config.loss_scale, max_overflows_at_min_scale);
  }
  if (config.deepspeed_semantics) {
    return std::make_unique<DeepSpeedLossScaler>(config, max_overflows_at_min_scale);
  }
  TANDEM_CHECK_ARG(config.initial_scale_power >= 0 && config.initial_scale_power <= 127,
                   "fp16.initial_scale_power is {}; torch's GradScaler keeps the scale in "
                   "float32, so use 0..127 (the default is 16)",
                   config.initial_scale_power);
  GradScalerOptions options;
  options.init_scale = std::ldexp(1.0, config.initial_scale_power);
  // Without a window given, torch's own interval (2000).
  if (config.loss_scale_window) options.growth_interval = *config.loss_scale_window;
  options.min_loss_scale = config.min_loss_scale;
  options.max_overflows_at_min_scale = max_overflows_at_min_scale;
  return std::make_unique<GradScaler>(options);
}

}  // namespace tandem
