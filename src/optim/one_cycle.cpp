// OneCycle: one triangular lr cycle (momentum mirrored), then decay.

#include <cmath>

#include "optim/optimizer_momentum.h"
#include "tandem/core/error.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {
namespace {

double required_lr(const std::optional<double>& value, const char* param) {
  TANDEM_CHECK_ARG(value.has_value(),
                   "OneCycle needs {} (it has no default in DeepSpeed); set "
                   "scheduler.params.{} in the config or OneCycleOptions::{}",
                   param, param, param);
  return *value;
}

}  // namespace

OneCycle::OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& options)
    : LRScheduler(optimizer),
      min_lr_(required_lr(options.cycle_min_lr, "cycle_min_lr")),
      max_lr_(required_lr(options.cycle_max_lr, "cycle_max_lr")),
      decay_lr_rate_(options.decay_lr_rate),
      first_step_size_(static_cast<double>(options.cycle_first_step_size)),
      second_step_size_(static_cast<double>(
          options.cycle_second_step_size.value_or(options.cycle_first_step_size))),
      total_size_(first_step_size_ + second_step_size_),
      step_ratio_(first_step_size_ / total_size_),
      first_stair_count_(options.cycle_first_stair_count),
      second_stair_count_(
          options.cycle_second_stair_count.value_or(options.cycle_first_stair_count)),
      decay_step_size_(options.decay_step_size),
      // DeepSpeed skips a decay when its rate or the step size is exactly 0.
      skip_lr_decay_(options.decay_step_size == 0 || options.decay_lr_rate == 0.0),
      skip_mom_decay_(options.decay_step_size == 0 || options.decay_mom_rate == 0.0),
      cycle_momentum_(options.cycle_momentum),
      min_mom_(options.cycle_min_mom),
      max_mom_(options.cycle_max_mom),
      decay_mom_rate_(options.decay_mom_rate) {
  TANDEM_CHECK_ARG(options.cycle_first_step_size > 0,
                   "OneCycle: cycle_first_step_size must be positive, got {}",
                   options.cycle_first_step_size);
  // DeepSpeed allows an empty second half: the cycle only rises.
  TANDEM_CHECK_ARG(second_step_size_ >= 0, "OneCycle: cycle_second_step_size must be >= 0, got {}",
                   second_step_size_);
  TANDEM_CHECK_ARG(first_stair_count_ >= 0 && second_stair_count_ >= 0,
                   "OneCycle: stair counts must be >= 0 (0: no stairs), got "
                   "cycle_first_stair_count {} and cycle_second_stair_count {}",
                   first_stair_count_, second_stair_count_);
  TANDEM_CHECK_ARG(decay_step_size_ >= 0,
                   "OneCycle: decay_step_size must be >= 0 (0: no decay), got {}",
                   decay_step_size_);
  if (cycle_momentum_) {
    const auto& groups = optimizer.param_groups();
    for (size_t i = 0; i < groups.size(); ++i) {
      // DeepSpeed only warns and stops cycling; a schedule silently not doing
      // half of what the config asked is worse.
      TANDEM_CHECK_ARG(detail::has_momentum(groups[i].options()),
                       "OneCycle: cycle_momentum is true but param group {} uses {}, which has "
                       "no momentum to cycle (Adam/AdamW cycle beta1, SGD cycles momentum); set "
                       "cycle_momentum to false",
                       i, detail::options_type_name(groups[i].options()));
    }
  }
  write_to_optimizer();
}

double OneCycle::scale_factor(int64_t iteration) const {
  // DeepSpeed evaluates the cycle one batch ahead of the counter.
  double batch = static_cast<double>(iteration + 1);
  double cycle = std::floor(1.0 + batch / total_size_);
  double x = 1.0 + batch / total_size_ - cycle;
  double scale;
  int64_t stairs;
  if (x <= step_ratio_) {
    scale = x / step_ratio_;
    stairs = first_stair_count_;
  } else {
    scale = (x - 1.0) / (step_ratio_ - 1.0);
    stairs = second_stair_count_;
  }
  if (stairs > 0) {
    // Quantise from the integer position in the cycle, not from `scale`: the
    // float scale can land a hair under a stair edge and floor a whole stair.
    double in_cycle = std::fmod(batch, total_size_);
    double position = in_cycle <= first_step_size_
                          ? in_cycle * static_cast<double>(stairs) / first_step_size_
                          : (total_size_ - in_cycle) * static_cast<double>(stairs) /
                                second_step_size_;
    scale = std::floor(position) / static_cast<double>(stairs);
  }
  return scale;
}

double OneCycle::decay_interval(int64_t iteration) const {
  double past_cycle = static_cast<double>(iteration) - total_size_ + 1.0;
  return past_cycle / static_cast<double>(decay_step_size_);
}

std::vector<double> OneCycle::lr_at(int64_t iteration) const {
  double lr;
  if (iteration < 0) {
    lr = min_lr_;
  } else if (static_cast<double>(iteration) < total_size_) {
    lr = min_lr_ + (max_lr_ - min_lr_) * scale_factor(iteration);
  } else if (skip_lr_decay_) {
    lr = min_lr_;
  } else {
    lr = min_lr_ / (1.0 + decay_lr_rate_ * decay_interval(iteration));
  }
  return std::vector<double>(num_groups(), lr);
}

double OneCycle::momentum_at(int64_t iteration) const {
  // At construction DeepSpeed writes the minimum, although the first step
  // moves momentum next to the maximum.
  if (iteration < 0) return min_mom_;
  if (static_cast<double>(iteration) < total_size_) {
    return max_mom_ - (max_mom_ - min_mom_) * scale_factor(iteration);
  }
  if (skip_mom_decay_) return max_mom_;
  return max_mom_ * (1.0 + decay_mom_rate_ * decay_interval(iteration));
}

void OneCycle::write_extra(int64_t iteration) {
  if (!cycle_momentum_) return;
  double momentum = momentum_at(iteration);
  for (auto& group : optimizer().param_groups()) {
    detail::set_momentum(group.options(), momentum);
  }
}

}  // namespace tandem
