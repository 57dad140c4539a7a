#pragma once
// Loss scaling for fp16 mixed precision (LibTorch has no GradScaler in C++,
// pytorch#44710).
//
// fp16 gradients underflow to zero unless the loss is multiplied by a large
// factor before backward(); the gradients are then divided by the same factor
// (unscale_and_find_inf() in "tandem/amp/unscale.h") before the optimizer
// step. A dynamic scaler starts high, halves the scale when a step produces
// inf/NaN gradients (and that step is skipped), and doubles it again after a
// run of clean steps. Two sets of rules are offered:
//
//   * GradScaler: torch.cuda.amp.GradScaler's, the one Accelerate uses;
//   * DeepSpeedLossScaler: deepspeed/runtime/fp16/loss_scaler.py's
//     DynamicLossScaler, with hysteresis and a minimum scale.
//
// One training step with any scaler:
//
//   auto scaler = tandem::make_loss_scaler(config.fp16, config.mixed_precision);
//   (loss * scaler->scale()).backward();
//   bool found_inf = tandem::unscale_and_find_inf(grads, scaler->inv_scale());
//   found_inf = tandem::any_rank_found_inf(group, found_inf);  // ranks must agree
//   if (!scaler->update(found_inf)) optimizer.step();
//   optimizer.zero_grad();
//
// Scale collapse. When every step overflows even with the scale at its floor,
// the model itself produces inf/NaN and lowering the scale cannot help: the
// run would skip every step forever. update() then throws ScaleCollapseError
// after `max_overflows_at_min_scale` consecutive overflowing steps that ran
// with scale() <= min_loss_scale (default 10 steps; 0 turns the check off).
// A static scaler cannot adapt at all, so any run of that many consecutive
// overflowing steps counts. DeepSpeed stops at the first such overflow
// ("Current loss scale already at minimum"); set the count to 1 for that.
//
// Thread-safety: none. A scaler belongs to the thread that steps the
// optimizer; every rank keeps its own and feeds it the same found_inf.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace tandem {

// Thrown by LossScaler::update() when the loss scale has collapsed (above).
// The message names the steps, the scale and the knobs to change.
class ScaleCollapseError : public Error {
 public:
  using Error::Error;
};

// Consecutive overflowing steps at the minimum scale before update() throws.
constexpr int64_t kDefaultMaxOverflowsAtMinScale = 10;

// Which rules a scaler follows. Stored in state_dict() as a number.
enum class LossScaleRule {
  kDisabled = 0,   // bf16 or fp32: scale 1, never skips
  kStatic = 1,     // a fixed scale; overflowing steps are skipped
  kTorch = 2,      // torch.cuda.amp.GradScaler
  kDeepSpeed = 3,  // DeepSpeed's DynamicLossScaler
};

// "disabled", "static", "torch", "deepspeed".
const char* to_string(LossScaleRule rule);

// Base of the scalers. Not copyable; build one per training run.
class LossScaler {
 public:
  virtual ~LossScaler();
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;

  virtual LossScaleRule rule() const = 0;

  // False for the bf16/fp32 scaler: scale() is 1 and update() never skips.
  bool enabled() const { return rule() != LossScaleRule::kDisabled; }

  // The factor to multiply the loss by before backward() in the current step.
  virtual double scale() const = 0;

  // 1 / scale(): the factor unscale_and_find_inf() takes.
  double inv_scale() const { return 1.0 / scale(); }

  // Records the outcome of one optimizer step and sets the scale for the
  // next. Call it once per optimizer step (not per micro-batch), after the
  // gradients were checked, with the same found_inf on every rank. Returns
  // true when the step must be skipped: found_inf on an enabled scaler.
  // Throws ScaleCollapseError (see above) after recording the step, so that
  // state_dict() still describes the run.
  bool update(bool found_inf);

  // update() calls so far, and how many of them returned true.
  int64_t steps() const { return steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }

  // Consecutive overflowing steps that ran at the minimum scale (the
  // collapse counter); 0 after any clean step.
  int64_t overflows_at_min_scale() const { return overflows_at_min_scale_; }

  // The scaler's position as plain numbers, for checkpoints: "rule" (the
  // LossScaleRule), "steps", "skipped_steps", "overflows_at_min_scale",
  // plus "scale" and the rule's own keys (see each class).
  std::map<std::string, double> state_dict() const;

  // Restores a state_dict() of a scaler with the same rule, so that the next
  // update() continues the saved sequence. Throws UsageError, changing
  // nothing, on another rule, missing or unknown keys, or invalid values.
  void load_state_dict(const std::map<std::string, double>& state);

 protected:
  // `min_loss_scale`: the floor of the collapse check.
  LossScaler(double min_loss_scale, int64_t max_overflows_at_min_scale);

  // Moves the scale after a step; the rule's whole logic.
  virtual void update_scale(bool found_inf) = 0;

  // The rule's state_dict() entries beyond the common ones ("scale" among
  // them), and their restore. load_rule_state() sees exactly the keys that
  // rule_state() writes, and must validate every value before changing
  // anything.
  virtual std::map<std::string, double> rule_state() const = 0;
  virtual void load_rule_state(const std::map<std::string, double>& state) = 0;

 private:
  [[noreturn]] void throw_collapse(double attempted_scale) const;

  double min_loss_scale_;
  int64_t max_overflows_at_min_scale_;
  int64_t steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t overflows_at_min_scale_ = 0;
};

// torch.cuda.amp.GradScaler's constructor arguments, plus tandem's collapse
// check (torch has none: its scale keeps halving toward zero).
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;
  // false: behaves as the disabled scaler (scale 1, never skips).
  bool enabled = true;
  double min_loss_scale = 1.0;  // collapse floor only; the scale is not clamped
  int64_t max_overflows_at_min_scale = kDefaultMaxOverflowsAtMinScale;
};

// torch.cuda.amp.GradScaler's update rule (torch's _amp_update_scale_):
//   inf/NaN: scale *= backoff_factor, growth_tracker = 0, step skipped;
//   clean:   growth_tracker += 1, and when it reaches growth_interval,
//            scale *= growth_factor and growth_tracker = 0.
// The scale is kept in float32 as torch keeps it, and, as in torch 2.x, a
// growth that would overflow float32 is not applied.
// State keys: "growth_tracker", "growth_factor", "backoff_factor",
// "growth_interval" (torch's state_dict restores its factors too).
class GradScaler : public LossScaler {
 public:
  // Throws UsageError on a scale that is not a positive finite float32, a
  // growth_factor <= 1, a backoff_factor outside (0, 1), or a
  // growth_interval < 1.
  explicit GradScaler(const GradScalerOptions& options = {});

  LossScaleRule rule() const override;
  double scale() const override;
  int64_t growth_tracker() const { return growth_tracker_; }
  const GradScalerOptions& options() const { return options_; }

 protected:
  void update_scale(bool found_inf) override;
  std::map<std::string, double> rule_state() const override;
  void load_rule_state(const std::map<std::string, double>& state) override;

 private:
  GradScalerOptions options_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

// DeepSpeed's DynamicLossScaler.update_scale(overflow), built from a
// DeepSpeed fp16 block (loss_scale 0):
//   scale starts at 2^initial_scale_power; hysteresis at `hysteresis`.
//   overflow: if hysteresis == 1, scale = max(scale / 2, min_loss_scale);
//             else hysteresis -= 1. Then last_overflow_iter = cur_iter.
//   clean:    if consecutive_hysteresis, hysteresis = `hysteresis`;
//             stable = cur_iter - last_overflow_iter - 1; if stable > 0 and
//             stable % loss_scale_window == 0, scale *= 2 (and hysteresis =
//             `hysteresis` when not consecutive_hysteresis).
//   cur_iter += 1 after every update (last_overflow_iter starts at -1).
// So the scale doubles on the clean step after loss_scale_window clean steps
// in a row, from the start or from the last overflow: the rule of DeepSpeed
// 0.19.8's DynamicLossScaler (the one its ZeRO path builds), checked step for
// step against it (DeepSpeedScalerTest.*, the traces recorded from it).
// DeepSpeed releases before its `stable_interval` grew one step earlier.
// State keys: "cur_iter", "last_overflow_iter", "cur_hysteresis".
class DeepSpeedLossScaler : public LossScaler {
 public:
  // Throws UsageError when config.loss_scale != 0 (that is a static scale),
  // or on initial_scale_power outside [0, 1000], loss_scale_window < 1,
  // hysteresis < 1 or min_loss_scale <= 0.
  explicit DeepSpeedLossScaler(
      const LossScaleConfig& config,
      int64_t max_overflows_at_min_scale = kDefaultMaxOverflowsAtMinScale);

  LossScaleRule rule() const override;
  double scale() const override;
  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int cur_hysteresis() const { return cur_hysteresis_; }

 protected:
  void update_scale(bool found_inf) override;
  std::map<std::string, double> rule_state() const override;
  void load_rule_state(const std::map<std::string, double>& state) override;

 private:
  LossScaleConfig config_;
  int64_t window_;  // loss_scale_window, or DeepSpeed's 1000
  double scale_;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int cur_hysteresis_;
};

// A fixed scale (DeepSpeed's fp16.loss_scale > 0). Overflowing steps are
// still skipped, as DeepSpeed does; the scale never changes.
class StaticLossScaler : public LossScaler {
 public:
  // Throws UsageError unless `scale` is positive and finite.
  explicit StaticLossScaler(double scale,
                            int64_t max_overflows = kDefaultMaxOverflowsAtMinScale);

  LossScaleRule rule() const override;
  double scale() const override;

 protected:
  void update_scale(bool found_inf) override;
  std::map<std::string, double> rule_state() const override;
  void load_rule_state(const std::map<std::string, double>& state) override;

 private:
  double scale_;
};

// The scaler for a run's precision and fp16 block:
//   bf16 / no:                  a disabled GradScaler (scale 1, never skips);
//   fp16, loss_scale > 0:       StaticLossScaler(loss_scale);
//   fp16, deepspeed_semantics:  DeepSpeedLossScaler(config);
//   fp16 otherwise:             GradScaler with init_scale
//     2^initial_scale_power, growth_interval loss_scale_window (torch's 2000
//     when no window was given), factors 2 and
//     0.5, and min_loss_scale as the collapse floor (hysteresis is DeepSpeed's
//     and has no effect here).
// Throws UsageError on invalid values (see the constructors).
std::unique_ptr<LossScaler> make_loss_scaler(
    const LossScaleConfig& config, MixedPrecision precision,
    int64_t max_overflows_at_min_scale = kDefaultMaxOverflowsAtMinScale);

}  // namespace tandem
