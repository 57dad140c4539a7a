#pragma once
// The Accelerator's RAII guards and handles, defined outside its class to
// keep accelerator.h readable: Accelerator::AccumulateGuard (accumulate()),
// NoSyncGuard (no_sync()), JoinGuard (join_uneven_inputs()) and HookHandle
// (register_*_state_pre_hook()). Included by accelerator.h; include that.

#include <cstdint>
#include <memory>
#include <utility>

#include "tandem/accelerate/accelerator.h"

namespace tandem {

// One micro-step for every backward while it lives (Accelerator::accumulate).
class Accelerator::AccumulateGuard {
 public:
  ~AccumulateGuard();
  AccumulateGuard(const AccumulateGuard&) = delete;
  AccumulateGuard& operator=(const AccumulateGuard&) = delete;
 private:
  friend class Accelerator;
  explicit AccumulateGuard(std::shared_ptr<detail::StepController> controller);
  std::shared_ptr<detail::StepController> controller_;
  bool outer_was_open_;
};

// No gradient communication for one prepared model while it lives.
class Accelerator::NoSyncGuard {
 public:
  ~NoSyncGuard();
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
 private:
  friend class Accelerator;
  NoSyncGuard(std::shared_ptr<detail::ModelStrategy> strategy,
              std::shared_ptr<detail::StepController> controller);
  std::shared_ptr<detail::ModelStrategy> strategy_;
  std::shared_ptr<detail::StepController> controller_;
};

// Passes that start while it lives are joined (Accelerator::join_uneven_inputs).
class Accelerator::JoinGuard {
 public:
  ~JoinGuard();
  JoinGuard(const JoinGuard&) = delete;
  JoinGuard& operator=(const JoinGuard&) = delete;
 private:
  friend class Accelerator;
  explicit JoinGuard(std::shared_ptr<detail::StepController> controller);
  std::shared_ptr<detail::StepController> controller_;
};

// Removes its hook (again, or after the Accelerator: nothing).
class Accelerator::HookHandle {
 public:
  void remove();
 private:
  friend class Accelerator;
  HookHandle(std::weak_ptr<detail::StateHooks> hooks, bool save, int64_t id)
      : hooks_(std::move(hooks)), save_(save), id_(id) {}
  std::weak_ptr<detail::StateHooks> hooks_;
  bool save_;
  int64_t id_;
};

template <typename... Models>
Accelerator::AccumulateGuard Accelerator::accumulate(const Models&... models) {
  (check_prepared(module_of(models), "accumulate"), ...);
  return begin_accumulate();
}

template <typename Model>
Accelerator::NoSyncGuard Accelerator::no_sync(const Model& model) {
  return no_sync_at(check_prepared(module_of(model), "no_sync"));
}

}  // namespace tandem
