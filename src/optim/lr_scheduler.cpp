#include "tandem/optim/lr_scheduler.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/text.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

constexpr const char* kIterationKey = "last_batch_iteration";
// "type.<name()>" = 1 names the kind of scheduler that saved a state.
constexpr const char* kTypePrefix = "type.";

}  // namespace

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer)
    : optimizer_(optimizer), num_groups_(optimizer.param_groups().size()) {
  TANDEM_CHECK_ARG(num_groups_ > 0,
                   "the optimizer has no param groups; build the scheduler after the "
                   "optimizer has its parameters");
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::step() {
  ++last_batch_iteration_;
  write_to_optimizer();
}

std::vector<double> LRScheduler::get_last_lr() const { return last_lr_; }

int64_t LRScheduler::last_batch_iteration() const { return last_batch_iteration_; }

void LRScheduler::write_to_optimizer() {
  auto& groups = optimizer_.param_groups();
  // DeepSpeed zips groups with its per-group lists and silently skips groups
  // added later; here that would leave a group unscheduled, so say so.
  TANDEM_CHECK(groups.size() == num_groups_,
               "{}: the optimizer has {} param groups but the scheduler was built for {}; "
               "add all param groups before building the scheduler",
               name(), groups.size(), num_groups_);
  std::vector<double> lrs = lr_at(last_batch_iteration_);
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].options().set_lr(lrs[i]);
  }
  write_extra(last_batch_iteration_);
  last_lr_ = std::move(lrs);
}

std::map<std::string, double> LRScheduler::state_dict() const {
  std::map<std::string, double> state;
  state[kIterationKey] = static_cast<double>(last_batch_iteration_);
  state[std::string(kTypePrefix) + name()] = 1.0;
  save_extra_state(state);
  return state;
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& state) {
  // The kind first: another kind's state would also have other keys, and
  // saying which kind saved it is the useful message. States saved before
  // the kind was recorded carry none.
  const std::string own_type = std::string(kTypePrefix) + name();
  for (const auto& entry : state) {
    const std::string& key = entry.first;
    if (key.rfind(kTypePrefix, 0) != 0 || key == own_type) continue;
    TANDEM_THROW(UsageError,
                 "{}: the scheduler state was saved by a {} scheduler; a {} cannot continue "
                 "another schedule. Build the same kind of scheduler as the run that saved it "
                 "(the config's scheduler.type), or do not load this state to start the new "
                 "schedule from its beginning",
                 name(), key.substr(std::string(kTypePrefix).size()), name());
  }
  std::set<std::string> expected = {kIterationKey};
  for (auto& key : extra_state_keys()) expected.insert(key);
  std::set<std::string> allowed = expected;
  allowed.insert(own_type);
  for (auto& key : optional_state_keys()) allowed.insert(key);
  std::set<std::string> missing;
  std::set<std::string> unknown;
  for (const auto& key : expected) {
    if (state.count(key) == 0) missing.insert(key);
  }
  for (const auto& entry : state) {
    if (allowed.count(entry.first) == 0) unknown.insert(entry.first);
  }
  TANDEM_CHECK_ARG(missing.empty() && unknown.empty(),
                   "{}: the scheduler state does not match this scheduler (missing keys: {}; "
                   "unknown keys: {}); load a state saved by the same kind of scheduler over "
                   "an optimizer with the same number of param groups ({})",
                   name(), detail::quoted_keys(missing), detail::quoted_keys(unknown), num_groups_);

  double iteration = state.at(kIterationKey);
  TANDEM_CHECK_ARG(std::isfinite(iteration) && iteration == std::floor(iteration) &&
                       iteration >= -1 &&
                       iteration < static_cast<double>(std::numeric_limits<int64_t>::max()),
                   "{}: state '{}' must be an integer >= -1, got {}", name(), kIterationKey,
                   iteration);
  // Validate everything before changing anything.
  load_extra_state(state);
  last_batch_iteration_ = static_cast<int64_t>(iteration);
  write_to_optimizer();
}

void LRScheduler::write_extra(int64_t /*iteration*/) {}

std::vector<std::string> LRScheduler::extra_state_keys() const { return {}; }

std::vector<std::string> LRScheduler::optional_state_keys() const { return {}; }

void LRScheduler::save_extra_state(std::map<std::string, double>& /*state*/) const {}

void LRScheduler::load_extra_state(const std::map<std::string, double>& /*state*/) {}

}  // namespace tandem
