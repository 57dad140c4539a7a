// make_lr_scheduler(): a DeepSpeed `scheduler` block to a scheduler.

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "config/did_you_mean.h"
#include "tandem/core/error.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {
namespace {

// ", did you mean 'X'?" or "".
std::string did_you_mean(const std::string& text, const std::vector<std::string>& candidates) {
  const std::string best = config_detail::closest_candidate(text, candidates);
  return best.empty() ? "" : fmt::format(", did you mean '{}'?", best);
}


enum class ParamKind { kReal, kCount, kFlag };

struct ParamSpec {
  std::string name;
  ParamKind kind;
  std::function<void(double)> apply;
};

// Where an "auto" value normally comes from, for the error when none came.
std::string auto_source(const std::string& param) {
  if (param == "warmup_max_lr" || param == "cycle_max_lr") return "the optimizer's lr";
  if (param == "total_num_steps") return "the program's max training steps";
  if (param == "warmup_num_steps") return "the program's warmup steps";
  if (param == "warmup_min_lr") return "0, as HF Transformers uses";
  return "the program";
}

double resolve_value(const std::string& type, const std::string& param,
                     const SchedulerConfig& config,
                     const std::map<std::string, double>& auto_values) {
  auto given = config.params.find(param);
  if (given != config.params.end()) return given->second;
  auto supplied = auto_values.find(param);
  TANDEM_CHECK_ARG(supplied != auto_values.end(),
                   "scheduler.params.{} of {} is \"auto\" but nothing supplied its value; write "
                   "a number in the config, or pass it to make_lr_scheduler() in auto_values "
                   "(normally {}, which the Accelerator fills in when it knows it)",
                   param, type, auto_source(param));
  return supplied->second;
}

double checked(const std::string& param, ParamKind kind, double value) {
  TANDEM_CHECK_ARG(std::isfinite(value), "scheduler.params.{} must be a finite number, got {}",
                   param, value);
  if (kind == ParamKind::kCount) {
    // 2^53: the largest range where every integer is exact as a double.
    TANDEM_CHECK_ARG(value == std::floor(value) && std::fabs(value) <= 9007199254740992.0,
                     "scheduler.params.{} counts optimizer steps and must be an integer, got {}",
                     param, value);
  } else if (kind == ParamKind::kFlag) {
    TANDEM_CHECK_ARG(value == 0.0 || value == 1.0,
                     "scheduler.params.{} must be true or false, got {}", param, value);
  }
  return value;
}

void apply_params(const std::string& type, const std::vector<ParamSpec>& specs,
                  const SchedulerConfig& config,
                  const std::map<std::string, double>& auto_values) {
  std::vector<std::string> names;
  for (const auto& spec : specs) names.push_back(spec.name);
  if (type != "OneCycle") names.push_back("warmup_type");
  auto check_known = [&](const std::string& param) {
    TANDEM_CHECK_ARG(param != "warmup_type" || type == "OneCycle",
                     "scheduler.params.warmup_type must be \"log\" or \"linear\"; it cannot be "
                     "\"auto\"");
    for (const auto& spec : specs) {
      if (spec.name == param) return;
    }
    TANDEM_THROW(UsageError,
                 "scheduler.params.{} is not a {} parameter{}; {} takes: {}", param, type,
                 did_you_mean(param, names), type, config_detail::join_alternatives(names, "and"));
  };
  for (const auto& entry : config.params) check_known(entry.first);
  for (const auto& param : config.auto_params) check_known(param);

  for (const auto& spec : specs) {
    bool present = config.params.count(spec.name) != 0 || config.auto_params.count(spec.name) != 0;
    if (!present) continue;
    double value = resolve_value(type, spec.name, config, auto_values);
    spec.apply(checked(spec.name, spec.kind, value));
  }
}

WarmupType warmup_type_of(const SchedulerConfig& config) {
  return config.warmup_type.empty() ? WarmupType::kLog : parse_warmup_type(config.warmup_type);
}

int64_t as_count(double value) { return static_cast<int64_t>(value); }

constexpr const char* kIterationParam = "last_batch_iteration";

std::unique_ptr<LRScheduler> make_warmup_lr(const SchedulerConfig& config,
                                            torch::optim::Optimizer& optimizer,
                                            const std::map<std::string, double>& auto_values) {
  WarmupLROptions o;
  apply_params("WarmupLR",
               {{"warmup_min_lr", ParamKind::kReal, [&](double v) { o.warmup_min_lr = v; }},
                {"warmup_max_lr", ParamKind::kReal, [&](double v) { o.warmup_max_lr = v; }},
                {"warmup_num_steps", ParamKind::kCount,
                 [&](double v) { o.warmup_num_steps = as_count(v); }}},
               config, auto_values);
  o.warmup_type = warmup_type_of(config);
  return std::make_unique<WarmupLR>(optimizer, o);
}

std::unique_ptr<LRScheduler> make_warmup_decay_lr(
    const SchedulerConfig& config, torch::optim::Optimizer& optimizer,
    const std::map<std::string, double>& auto_values) {
  WarmupDecayLROptions o;
  apply_params("WarmupDecayLR",
               {{"total_num_steps", ParamKind::kCount,
                 [&](double v) { o.total_num_steps = as_count(v); }},
                {"warmup_min_lr", ParamKind::kReal, [&](double v) { o.warmup_min_lr = v; }},
                {"warmup_max_lr", ParamKind::kReal, [&](double v) { o.warmup_max_lr = v; }},
                {"warmup_num_steps", ParamKind::kCount,
                 [&](double v) { o.warmup_num_steps = as_count(v); }}},
               config, auto_values);
  o.warmup_type = warmup_type_of(config);
  return std::make_unique<WarmupDecayLR>(optimizer, o);
}

std::unique_ptr<LRScheduler> make_warmup_cosine_lr(
    const SchedulerConfig& config, torch::optim::Optimizer& optimizer,
    const std::map<std::string, double>& auto_values) {
  WarmupCosineLROptions o;
  apply_params("WarmupCosineLR",
               {{"total_num_steps", ParamKind::kCount,
                 [&](double v) { o.total_num_steps = as_count(v); }},
                {"warmup_min_ratio", ParamKind::kReal, [&](double v) { o.warmup_min_ratio = v; }},
                {"warmup_num_steps", ParamKind::kCount,
                 [&](double v) { o.warmup_num_steps = as_count(v); }},
                {"cos_min_ratio", ParamKind::kReal, [&](double v) { o.cos_min_ratio = v; }}},
               config, auto_values);
  o.warmup_type = warmup_type_of(config);
  return std::make_unique<WarmupCosineLR>(optimizer, o);
}

std::unique_ptr<LRScheduler> make_one_cycle(const SchedulerConfig& config,
                                            torch::optim::Optimizer& optimizer,
                                            const std::map<std::string, double>& auto_values) {
  TANDEM_CHECK_ARG(config.warmup_type.empty(),
                   "scheduler.params.warmup_type does not apply to OneCycle (it has no warmup); "
                   "remove it");
  OneCycleOptions o;
  apply_params(
      "OneCycle",
      {{"cycle_min_lr", ParamKind::kReal, [&](double v) { o.cycle_min_lr = v; }},
       {"cycle_max_lr", ParamKind::kReal, [&](double v) { o.cycle_max_lr = v; }},
       {"decay_lr_rate", ParamKind::kReal, [&](double v) { o.decay_lr_rate = v; }},
       {"cycle_first_step_size", ParamKind::kCount,
        [&](double v) { o.cycle_first_step_size = as_count(v); }},
       {"cycle_second_step_size", ParamKind::kCount,
        [&](double v) { o.cycle_second_step_size = as_count(v); }},
       {"cycle_first_stair_count", ParamKind::kCount,
        [&](double v) { o.cycle_first_stair_count = as_count(v); }},
       {"cycle_second_stair_count", ParamKind::kCount,
        [&](double v) { o.cycle_second_stair_count = as_count(v); }},
       {"decay_step_size", ParamKind::kCount, [&](double v) { o.decay_step_size = as_count(v); }},
       {"cycle_momentum", ParamKind::kFlag, [&](double v) { o.cycle_momentum = v != 0.0; }},
       {"cycle_min_mom", ParamKind::kReal, [&](double v) { o.cycle_min_mom = v; }},
       {"cycle_max_mom", ParamKind::kReal, [&](double v) { o.cycle_max_mom = v; }},
       {"decay_mom_rate", ParamKind::kReal, [&](double v) { o.decay_mom_rate = v; }}},
      config, auto_values);
  return std::make_unique<OneCycle>(optimizer, o);
}

}  // namespace

const std::vector<std::string>& lr_scheduler_types() {
  static const std::vector<std::string> types = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                 "OneCycle"};
  return types;
}

std::unique_ptr<LRScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               torch::optim::Optimizer& optimizer,
                                               const std::map<std::string, double>& auto_values) {
  const auto& types = lr_scheduler_types();
  TANDEM_CHECK_ARG(!config.type.empty(),
                   "the scheduler config has no type; set scheduler.type to one of {} (or build "
                   "no scheduler when the config has none)",
                   config_detail::join_alternatives(types));
  // DeepSpeed's last_batch_iteration: the schedule continues from that
  // counter. Taken out here, set once the scheduler is built.
  SchedulerConfig rest = config;
  TANDEM_CHECK_ARG(rest.auto_params.count(kIterationParam) == 0,
                   "scheduler.params.{} cannot be \"auto\"; write the counter to continue from "
                   "(-1: from the start)",
                   kIterationParam);
  std::optional<int64_t> start;
  if (const auto it = rest.params.find(kIterationParam); it != rest.params.end()) {
    const double value = checked(kIterationParam, ParamKind::kCount, it->second);
    TANDEM_CHECK_ARG(value >= -1, "scheduler.params.{} must be an integer >= -1, got {}",
                     kIterationParam, value);
    start = as_count(value);
    rest.params.erase(it);
  }
  std::unique_ptr<LRScheduler> scheduler;
  if (rest.type == "WarmupLR") scheduler = make_warmup_lr(rest, optimizer, auto_values);
  if (rest.type == "WarmupDecayLR") scheduler = make_warmup_decay_lr(rest, optimizer, auto_values);
  if (rest.type == "WarmupCosineLR") {
    scheduler = make_warmup_cosine_lr(rest, optimizer, auto_values);
  }
  if (rest.type == "OneCycle") scheduler = make_one_cycle(rest, optimizer, auto_values);
  if (scheduler) {
    // As a checkpoint's state at that counter: the optimizer gets the rates
    // of step `start`, and the next step() those of start + 1.
    if (start && *start != -1) {
      std::map<std::string, double> state = scheduler->state_dict();
      state[kIterationParam] = static_cast<double>(*start);
      scheduler->load_state_dict(state);
    }
    return scheduler;
  }
  TANDEM_CHECK_ARG(config.type != "LRRangeTest",
                   "scheduler.type LRRangeTest (DeepSpeed's lr range test) is not implemented in "
                   "tandem; use one of {}",
                   config_detail::join_alternatives(types));
  TANDEM_THROW(UsageError, "scheduler.type '{}' is not a known scheduler{}; valid types: {}",
               config.type, did_you_mean(config.type, types), config_detail::join_alternatives(types));
}

}  // namespace tandem
