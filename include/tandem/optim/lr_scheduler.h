#pragma once
// Learning-rate schedulers with DeepSpeed's semantics (deepspeed/runtime/
// lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR and OneCycle.
//
//   torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-4));
//   tandem::WarmupCosineLROptions options;
//   options.total_num_steps = 10'000;
//   options.warmup_num_steps = 100;
//   tandem::WarmupCosineLR scheduler(optimizer, options);
//   for (...) { ... optimizer.step(); scheduler.step(); }
//
// A scheduler writes its learning rate (and, for OneCycle, its momentum) into
// every param group of the optimizer: once at construction (DeepSpeed's
// "last_batch_iteration == -1" start) and then on every step(). Call step()
// once per real optimizer step, i.e. once per gradient_accumulation_steps
// micro-batches (a prepared scheduler follows Accelerate's rule instead:
// num_processes steps per optimizer step); docs/schedulers.md has the
// formulas.
//
// Thread-safety: none. A scheduler belongs to the thread that steps its
// optimizer. It keeps a reference to the optimizer, which must outlive it
// (as for LibTorch's schedulers; Accelerator::prepare_scheduler keeps both
// alive for you), and must be built after the optimizer has all its param
// groups.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "tandem/config/config.h"

namespace tandem {

// Base of the four schedulers. Not copyable (it refers to one optimizer).
class LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // DeepSpeed's class name: "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
  // "OneCycle".
  virtual const char* name() const = 0;

  // Advances one optimizer step (last_batch_iteration() + 1) and writes the
  // new learning rate (and momentum, for OneCycle) into every param group.
  // Throws Error when the optimizer's param groups changed in number since
  // construction.
  void step();

  // The learning rate per param group that the scheduler last wrote, at
  // construction or by the latest step() or load_state_dict().
  std::vector<double> get_last_lr() const;

  // DeepSpeed's counter: -1 after construction, 0 after the first step().
  int64_t last_batch_iteration() const;

  // The scheduler's position as plain numbers, for checkpoints:
  // "last_batch_iteration", "type.<name()>" = 1 (the kind that saved it),
  // plus "initial_lr.<group>" for WarmupCosineLR and "warmup_max_lr.<group>"
  // for a WarmupLR whose peaks are its groups' own learning rates.
  std::map<std::string, double> state_dict() const;

  // Restores a state_dict() of the same kind of scheduler and writes the
  // learning rate (and momentum) for that position into the optimizer, so
  // the next step() continues the saved sequence. Throws UsageError, changing
  // nothing, on a state of another kind, missing or unknown keys, or values
  // that are not valid. A state without "type." (saved by tandem before it
  // recorded the kind) or without a WarmupLR's peaks is still read.
  void load_state_dict(const std::map<std::string, double>& state);

  // The optimizer whose learning rates it writes.
  torch::optim::Optimizer& optimizer() const { return optimizer_; }

 protected:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);

  // The learning rate of every param group after the step that made the
  // counter `iteration`; iteration -1 is the value written at construction.
  virtual std::vector<double> lr_at(int64_t iteration) const = 0;
  // Writes whatever else the schedule drives (OneCycle's momentum) for
  // `iteration`. The default writes nothing.
  virtual void write_extra(int64_t iteration);
  // Extra state_dict() entries and their restore; load_extra_state() sees
  // only validated keys from extra_state_keys().
  virtual std::vector<std::string> extra_state_keys() const;
  // Keys a state may carry or lack (older saves lack them); load_extra_state()
  // sees them only when present.
  virtual std::vector<std::string> optional_state_keys() const;
  virtual void save_extra_state(std::map<std::string, double>& state) const;
  virtual void load_extra_state(const std::map<std::string, double>& state);

  // Writes lr_at(last_batch_iteration()) and write_extra() into the
  // optimizer. Each derived constructor calls it last.
  void write_to_optimizer();

  size_t num_groups() const { return num_groups_; }

 private:
  torch::optim::Optimizer& optimizer_;
  size_t num_groups_;
  int64_t last_batch_iteration_ = -1;
  std::vector<double> last_lr_;
};

// How the warmup rises from its start to its peak over warmup_num_steps (W).
enum class WarmupType {
  kLog,     // gamma(t) = ln(t + 1) / ln(W)
  kLinear,  // gamma(t) = t / W
};

// "log", "linear".
const char* to_string(WarmupType type);
// Accepts "log" and "linear"; throws UsageError naming them otherwise.
WarmupType parse_warmup_type(const std::string& text);

// DeepSpeed's WarmupLR: rises from warmup_min_lr to warmup_max_lr over
// warmup_num_steps steps, then stays at warmup_max_lr.
struct WarmupLROptions {
  double warmup_min_lr = 0.0;
  // Empty: each param group's own learning rate when the scheduler is
  // built (DeepSpeed's [group['lr'] for group in param_groups]).
  std::optional<double> warmup_max_lr;
  // Must be positive; DeepSpeed warms up over max(2, warmup_num_steps).
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
};

class WarmupLR : public LRScheduler {
 public:
  // Writes warmup_min_lr into every param group. Throws UsageError on a
  // non-positive warmup_num_steps.
  WarmupLR(torch::optim::Optimizer& optimizer, const WarmupLROptions& options = {});
  const char* name() const override { return "WarmupLR"; }

 protected:
  // For WarmupDecayLR: writes nothing; the derived constructor does.
  WarmupLR(torch::optim::Optimizer& optimizer, double min_lr, std::vector<double> max_lrs,
           int64_t warmup_num_steps, WarmupType warmup_type, const char* scheduler_name);
  std::vector<double> lr_at(int64_t iteration) const override;
  // The fraction of the way from min to max lr after step `iteration` >= 0.
  virtual double gamma(int64_t iteration) const;
  double warmup_gamma(int64_t iteration) const;
  int64_t warmup_steps() const { return warmup_num_steps_; }
  // Peaks read from the groups' learning rates travel with the state: a
  // resumed run may build the scheduler over an optimizer whose lr the
  // checkpoint already changed.
  std::vector<std::string> optional_state_keys() const override;
  void save_extra_state(std::map<std::string, double>& state) const override;
  void load_extra_state(const std::map<std::string, double>& state) override;

 private:
  double min_lr_;
  std::vector<double> max_lrs_;  // per param group
  bool peaks_from_groups_ = false;  // no warmup_max_lr: each group's lr
  int64_t warmup_num_steps_;  // already max(2, n)
  WarmupType warmup_type_;
};

// DeepSpeed's WarmupDecayLR: WarmupLR's warmup, then a linear decay that
// reaches 0 at total_num_steps and stays there.
struct WarmupDecayLROptions {
  // Required: the number of optimizer steps in the whole run.
  std::optional<int64_t> total_num_steps;
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;  // DeepSpeed's default (not the optimizer's lr)
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
};

class WarmupDecayLR : public WarmupLR {
 public:
  // Writes warmup_min_lr into every param group. Throws UsageError when
  // total_num_steps is missing or not positive, or warmup_num_steps is not
  // positive; logs a warning when total_num_steps < warmup_num_steps.
  WarmupDecayLR(torch::optim::Optimizer& optimizer, const WarmupDecayLROptions& options);
  const char* name() const override { return "WarmupDecayLR"; }

 protected:
  double gamma(int64_t iteration) const override;

 private:
  int64_t total_num_steps_;
};

// DeepSpeed's WarmupCosineLR: every param group's learning rate is its own
// initial lr (read at construction) times a ratio that rises from
// warmup_min_ratio to 1 over the warmup, then follows a half cosine down to
// cos_min_ratio at total_num_steps and stays there.
struct WarmupCosineLROptions {
  // Required: the number of optimizer steps in the whole run.
  std::optional<int64_t> total_num_steps;
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 0.0001;
  WarmupType warmup_type = WarmupType::kLog;
};

class WarmupCosineLR : public LRScheduler {
 public:
  // Reads each group's lr as its initial lr, then writes 0 into every param
  // group (DeepSpeed's ratio before the first step). Throws UsageError as
  // WarmupDecayLR does.
  WarmupCosineLR(torch::optim::Optimizer& optimizer, const WarmupCosineLROptions& options);
  const char* name() const override { return "WarmupCosineLR"; }

  // The initial lr of each param group that the ratios multiply.
  const std::vector<double>& initial_lrs() const { return initial_lrs_; }

 protected:
  std::vector<double> lr_at(int64_t iteration) const override;
  std::vector<std::string> extra_state_keys() const override;
  void save_extra_state(std::map<std::string, double>& state) const override;
  void load_extra_state(const std::map<std::string, double>& state) override;

 private:
  double ratio_at(int64_t iteration) const;

  int64_t total_num_steps_;
  double warmup_min_ratio_;
  int64_t warmup_num_steps_;  // already max(2, n)
  double cos_min_ratio_;
  WarmupType warmup_type_;
  std::vector<double> initial_lrs_;
};

// DeepSpeed's OneCycle: one triangular cycle of the learning rate from
// cycle_min_lr up to cycle_max_lr and back (optionally in stairs), momentum
// moving the opposite way between cycle_max_mom and cycle_min_mom, then a
// decay phase. Momentum is Adam's/AdamW's beta1 (beta2 is left as it is) or
// SGD's momentum.
struct OneCycleOptions {
  // Required: the cycle's learning-rate bounds.
  std::optional<double> cycle_min_lr;
  std::optional<double> cycle_max_lr;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  // Empty: cycle_first_step_size.
  std::optional<int64_t> cycle_second_step_size;
  // 0: no stairs (the value moves every step).
  int64_t cycle_first_stair_count = 0;
  // Empty: cycle_first_stair_count.
  std::optional<int64_t> cycle_second_stair_count;
  // 0: no decay after the cycle (lr stays at cycle_min_lr, momentum at
  // cycle_max_mom).
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

class OneCycle : public LRScheduler {
 public:
  // Writes cycle_min_lr (and cycle_min_mom, when cycling momentum) into
  // every param group. Throws UsageError when cycle_min_lr or cycle_max_lr
  // is missing, a step size is not positive, a stair count or
  // decay_step_size is negative, or cycle_momentum is true and the
  // optimizer is not Adam, AdamW, SGD, RMSprop, Lion or Lamb.
  OneCycle(torch::optim::Optimizer& optimizer, const OneCycleOptions& options);
  const char* name() const override { return "OneCycle"; }

  // Whether momentum is being cycled (cycle_momentum).
  bool cycles_momentum() const { return cycle_momentum_; }

 protected:
  std::vector<double> lr_at(int64_t iteration) const override;
  void write_extra(int64_t iteration) override;

 private:
  double scale_factor(int64_t iteration) const;
  double momentum_at(int64_t iteration) const;
  // Steps past the end of the cycle, divided by decay_step_size.
  double decay_interval(int64_t iteration) const;

  double min_lr_;
  double max_lr_;
  double decay_lr_rate_;
  double first_step_size_;
  double second_step_size_;
  double total_size_;
  double step_ratio_;
  int64_t first_stair_count_;
  int64_t second_stair_count_;
  int64_t decay_step_size_;
  bool skip_lr_decay_;
  bool skip_mom_decay_;
  bool cycle_momentum_;
  double min_mom_;
  double max_mom_;
  double decay_mom_rate_;
};

// Builds the scheduler a DeepSpeed `scheduler` block describes, for
// `optimizer`. Parameters use DeepSpeed's names and defaults. A parameter
// the config gives as "auto" takes its value from `auto_values` (the
// Accelerator supplies e.g. warmup_max_lr = the optimizer's lr and
// total_num_steps = the program's max steps); values there for parameters
// that are not "auto" are ignored.
// Throws UsageError for an empty or unknown type (listing the valid ones,
// with a did-you-mean), an unknown parameter, an "auto" parameter with no
// supplied value (naming it and how to set it), a non-integer step count,
// a warmup_type other than "log"/"linear", and whatever the scheduler's
// constructor rejects.
std::unique_ptr<LRScheduler> make_lr_scheduler(
    const SchedulerConfig& config, torch::optim::Optimizer& optimizer,
    const std::map<std::string, double>& auto_values = {});

// The scheduler types make_lr_scheduler() builds, in DeepSpeed's spelling.
const std::vector<std::string>& lr_scheduler_types();

}  // namespace tandem
