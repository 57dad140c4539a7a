#pragma once
// Accelerator::Impl: the Accelerator's state and the parts it forwards to.
//
//   the job          the config (file, environment, overrides, resolved),
//                    the process group, ranks on the node, the device
//   strategies       StrategyFactory: how every prepared model is held
//   prepared         PreparedObjects: models, optimizers, schedulers and the
//                    micro-step controller they share
//   data             DataPreparation: prepare_data_loader & co., the
//                    training loader's position
//   checkpointer     Checkpointer: save_state/load_state, hooks, custom
//                    objects, save_model, load_model_weights
//   trackers         Trackers: init_trackers, log, wall_clock, progress bars
//   preemption       Preemption (with the config's preemption block): the
//                    signal handlers and the agreed stop at a step boundary
//
// The parts are built in this order and hold references to the ones before
// them (never after), so member order is construction order. Private to the
// Accelerator (accelerator*.cpp and local_sgd.cpp). Not thread-safe.

#include <cstdint>
#include <memory>

#include <c10/core/Device.h>

#include "accelerate/checkpointer.h"
#include "accelerate/data_preparation.h"
#include "accelerate/preemption.h"
#include "accelerate/prepared_objects.h"
#include "accelerate/strategy_factory.h"
#include "accelerate/trackers.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {

struct Accelerator::Impl {
  Impl(Config file_config, ConfigEnv env, std::shared_ptr<ProcessGroup> group, int local_rank,
       int local_world_size, const AcceleratorOptions& options);

  // The config from the file, the environment and AcceleratorOptions, with
  // the training loader's per-process batch once known (0: not yet).
  // Resolves the batch triple; UsageError when the loader and the config
  // disagree on the micro batch.
  void resolve(int64_t micro_batch);
  // UsageError naming `caller` unless `model` was prepared; its index.
  std::size_t index_of(const std::shared_ptr<torch::nn::Module>& model, const char* caller) const {
    return prepared.index_of(model, caller);
  }
  bool main_process() const { return group->rank() == 0; }
  // A prepared scheduler's wrapped steps per optimizer step (SchedulerCore).
  int64_t scheduler_steps_per_optimizer_step() const {
    if (!step_scheduler_with_optimizer) return 0;
    return split_batches ? 1 : group->world_size();
  }
  // Join (accelerator_join.cpp): the shadow-step gradient hooks over every
  // prepared model, and this micro-step's loss weight W / K (K ranks with
  // data), installing the hooks at the first joined backward.
  void install_shadow_hooks();
  double join_gradient_weight();

  Config file_config;
  ConfigEnv env;
  ConfigOverrides overrides;
  Config config;  // resolved
  std::shared_ptr<ProcessGroup> group;
  int local_rank = 0;
  int local_world_size = 1;
  // AcceleratorOptions' Accelerate data and scheduler settings.
  bool split_batches = false;
  std::optional<bool> dispatch_batches;
  bool step_scheduler_with_optimizer = true;
  // AcceleratorOptions' ProjectConfiguration fields.
  std::string project_dir;
  bool automatic_checkpoint_naming = false;
  int total_limit = 0;
  int64_t iteration = 0;
  bool save_on_each_node = false;  // AcceleratorOptions::save_on_each_node
  // project_dir/checkpoints; UsageError naming `caller` unless
  // automatic_checkpoint_naming and a project_dir were given.
  std::string automatic_checkpoint_dir(const char* caller) const;
  c10::Device device = c10::Device(c10::kCPU);
  std::shared_ptr<LossScaler> scaler;
  std::unique_ptr<detail::Trackers> trackers;
  std::unique_ptr<const detail::StrategyFactory> strategies;
  detail::PreparedObjects prepared;
  bool models_checked = false;  // every model's strategy->check_ready() ran
  // The shadow-step gradient hooks, installed at the first joined backward
  // (accelerator_join.cpp).
  std::unique_ptr<detail::JoinHooks> join_hooks;
  bool trigger = false;  // set_trigger() since the last check_trigger() that fired
  std::unique_ptr<detail::DataPreparation> data;
  std::unique_ptr<detail::Checkpointer> checkpointer;
  std::unique_ptr<detail::Preemption> preemption;

  // At a step boundary (accelerator_preemption.cpp): when some rank got a
  // preemption signal, save, requeue and exit; otherwise nothing.
  void preemption_boundary();
};

}  // namespace tandem
