// WarmupLR and WarmupDecayLR, and the warmup curve they share with
// WarmupCosineLR.

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "optim/warmup_shape.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {

const char* to_string(WarmupType type) {
  return type == WarmupType::kLinear ? "linear" : "log";
}

WarmupType parse_warmup_type(const std::string& text) {
  if (text == "log") return WarmupType::kLog;
  if (text == "linear") return WarmupType::kLinear;
  // DeepSpeed falls back to "log" with a warning; a typo silently changing
  // the curve is worse than stopping here.
  TANDEM_THROW(UsageError, "warmup_type '{}' is not valid; use \"log\" or \"linear\"", text);
}

namespace detail {

int64_t effective_warmup_steps(int64_t warmup_num_steps, const char* scheduler) {
  TANDEM_CHECK_ARG(warmup_num_steps > 0,
                   "{}: warmup_num_steps must be a positive integer, got {}; DeepSpeed warms "
                   "up over at least 2 steps, so 1 gives the shortest warmup",
                   scheduler, warmup_num_steps);
  return std::max<int64_t>(2, warmup_num_steps);
}

double warmup_fraction(WarmupType type, int64_t iteration, int64_t warmup_steps) {
  if (type == WarmupType::kLog) {
    return std::log(static_cast<double>(iteration + 1)) /
           std::log(static_cast<double>(warmup_steps));
  }
  return static_cast<double>(iteration) / static_cast<double>(warmup_steps);
}

int64_t required_total_steps(const std::optional<int64_t>& total, const char* scheduler) {
  TANDEM_CHECK_ARG(total.has_value(),
                   "{} needs total_num_steps (the number of optimizer steps in the run); set "
                   "scheduler.params.total_num_steps in the config (a number, or \"auto\" to "
                   "take the program's max steps) or {}Options::total_num_steps",
                   scheduler, scheduler);
  // 0 is DeepSpeed's too: the decay is over when the warmup ends.
  TANDEM_CHECK_ARG(*total >= 0, "{}: total_num_steps must be >= 0, got {}", scheduler, *total);
  return *total;
}

}  // namespace detail

namespace {

// DeepSpeed's WarmupLR without warmup_max_lr: each group's own lr, read when
// the scheduler is built.
std::vector<double> group_lrs(torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

}  // namespace

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, const WarmupLROptions& options)
    : WarmupLR(optimizer, options.warmup_min_lr,
               options.warmup_max_lr
                   ? std::vector<double>(optimizer.param_groups().size(), *options.warmup_max_lr)
                   : group_lrs(optimizer),
               options.warmup_num_steps, options.warmup_type, "WarmupLR") {
  peaks_from_groups_ = !options.warmup_max_lr.has_value();
  write_to_optimizer();
}

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, double min_lr, std::vector<double> max_lrs,
                   int64_t warmup_num_steps, WarmupType warmup_type,
                   const char* scheduler_name)
    : LRScheduler(optimizer),
      min_lr_(min_lr),
      max_lrs_(std::move(max_lrs)),
      warmup_num_steps_(detail::effective_warmup_steps(warmup_num_steps, scheduler_name)),
      warmup_type_(warmup_type) {}

std::vector<double> WarmupLR::lr_at(int64_t iteration) const {
  // Before the first step DeepSpeed starts every group at the minimum.
  std::vector<double> lrs(num_groups(), min_lr_);
  if (iteration < 0) return lrs;
  const double fraction = gamma(iteration);
  for (size_t g = 0; g < lrs.size() && g < max_lrs_.size(); ++g) {
    lrs[g] = min_lr_ + (max_lrs_[g] - min_lr_) * fraction;
  }
  return lrs;
}

namespace {

std::string peak_key(size_t group) { return fmt::format("warmup_max_lr.{}", group); }

}  // namespace

std::vector<std::string> WarmupLR::optional_state_keys() const {
  std::vector<std::string> keys;
  for (size_t g = 0; g < max_lrs_.size(); ++g) keys.push_back(peak_key(g));
  return keys;
}

void WarmupLR::save_extra_state(std::map<std::string, double>& state) const {
  if (!peaks_from_groups_) return;
  for (size_t g = 0; g < max_lrs_.size(); ++g) state[peak_key(g)] = max_lrs_[g];
}

void WarmupLR::load_extra_state(const std::map<std::string, double>& state) {
  // Peaks given in the options win over saved ones (the config decides).
  if (!peaks_from_groups_) return;
  std::vector<double> loaded = max_lrs_;
  for (size_t g = 0; g < loaded.size(); ++g) {
    const auto it = state.find(peak_key(g));
    if (it == state.end()) continue;
    TANDEM_CHECK_ARG(std::isfinite(it->second) && it->second >= 0,
                     "{}: state '{}' must be a finite lr >= 0, got {}", name(), peak_key(g),
                     it->second);
    loaded[g] = it->second;
  }
  max_lrs_ = std::move(loaded);
}

double WarmupLR::gamma(int64_t iteration) const {
  return iteration < warmup_num_steps_ ? warmup_gamma(iteration) : 1.0;
}

double WarmupLR::warmup_gamma(int64_t iteration) const {
  return detail::warmup_fraction(warmup_type_, iteration, warmup_num_steps_);
}


WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer,
                             const WarmupDecayLROptions& options)
    : WarmupLR(optimizer, options.warmup_min_lr,
               std::vector<double>(optimizer.param_groups().size(), options.warmup_max_lr),
               options.warmup_num_steps, options.warmup_type, "WarmupDecayLR"),
      total_num_steps_(detail::required_total_steps(options.total_num_steps, "WarmupDecayLR")) {
  if (total_num_steps_ < warmup_steps()) {
    log_warn("WarmupDecayLR: total_num_steps {} is less than warmup_num_steps {}",
             total_num_steps_, warmup_steps());
  }
  write_to_optimizer();
}

double WarmupDecayLR::gamma(int64_t iteration) const {
  if (iteration < warmup_steps()) return warmup_gamma(iteration);
  // Linear from 1 at the end of warmup to 0 at total_num_steps, then held.
  double remaining = static_cast<double>(total_num_steps_ - iteration);
  double span = std::max(1.0, static_cast<double>(total_num_steps_ - warmup_steps()));
  return std::max(0.0, remaining / span);
}

}  // namespace tandem
