#pragma once
// PreparedObjects: what an Accelerator's prepare_* calls registered (the
// models with their strategies, the optimizers, the schedulers) and the
// micro-step controller they share. The Accelerator owns one; its parts
// (checkpointing, data, LocalSGD) read it. prepare_* append to it and
// free_memory() empties it.
//
// PreparedAccess is the one door into the private parts of the objects
// prepare() returns (tandem/accelerate/prepared.h befriends it).
//
// Private to the Accelerator. Not thread-safe: the training thread uses it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "accelerate/prepared_internals.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/accelerate/prepared_streaming.h"

namespace tandem::detail {

class ModelStrategy;

// One prepared model: how it is held across ranks, the optimizers prepared
// over it (indices into PreparedObjects::optimizers; under ZeRO at most
// one), and the prefix of its tensors' checkpoint names.
struct PreparedModel {
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<ModelStrategy> strategy;  // shared with no_sync guards
  std::vector<std::size_t> optimizers;
  std::string prefix;
};

struct PreparedAccess {
  static OptimizerCore& core(const AcceleratedOptimizer& optimizer) { return *optimizer.core_; }
  static std::shared_ptr<AcceleratedOptimizer> make_optimizer(
      std::shared_ptr<torch::optim::Optimizer> wrapped, std::unique_ptr<OptimizerCore> core) {
    return std::shared_ptr<AcceleratedOptimizer>(
        new AcceleratedOptimizer(std::move(wrapped), std::move(core)));
  }
  static std::shared_ptr<AcceleratedScheduler> make_scheduler(
      std::shared_ptr<SchedulerCore> core) {
    return std::shared_ptr<AcceleratedScheduler>(new AcceleratedScheduler(std::move(core)));
  }
  static std::shared_ptr<PreparedLoader> make_loader(DistributedLoader loader,
                                                     std::shared_ptr<StepController> controller,
                                                     std::shared_ptr<LoaderCursor> cursor,
                                                     std::shared_ptr<ProcessGroup> group) {
    return std::shared_ptr<PreparedLoader>(new PreparedLoader(
        std::move(loader), std::move(controller), std::move(cursor), std::move(group)));
  }
  static std::shared_ptr<PreparedStreamingLoader> make_streaming_loader(
      StreamingLoader loader, std::shared_ptr<StepController> controller,
      std::shared_ptr<LoaderCursor> cursor) {
    return std::shared_ptr<PreparedStreamingLoader>(new PreparedStreamingLoader(
        std::move(loader), std::move(controller), std::move(cursor)));
  }
};

class PreparedObjects {
 public:
  PreparedObjects();

  // The micro-step state every prepared object shares. free_memory()
  // replaces it: the released objects keep the old one.
  const std::shared_ptr<StepController>& controller() const { return controller_; }

  std::vector<PreparedModel>& models() { return models_; }
  const std::vector<PreparedModel>& models() const { return models_; }
  std::vector<std::shared_ptr<AcceleratedOptimizer>>& optimizers() { return optimizers_; }
  const std::vector<std::shared_ptr<AcceleratedOptimizer>>& optimizers() const {
    return optimizers_;
  }
  std::vector<std::shared_ptr<SchedulerCore>>& schedulers() { return schedulers_; }
  const std::vector<std::shared_ptr<SchedulerCore>>& schedulers() const { return schedulers_; }

  // The index of the prepared `model`; UsageError naming `caller` otherwise.
  std::size_t index_of(const std::shared_ptr<torch::nn::Module>& model, const char* caller) const;
  // The prepared optimizer `caller` acts on when none is named: the only
  // one (UsageError for none or several).
  AcceleratedOptimizer& only_optimizer(const char* caller) const;
  // The prepared modules, in preparation order.
  std::vector<std::shared_ptr<torch::nn::Module>> modules() const;
  // The fp32 master weights of the prepared optimizers that keep them.
  std::vector<const MasterWeights*> master_weights() const;

  // Forgets everything prepared; a fresh controller at step 0 with
  // `accumulation_steps`.
  void clear(int64_t accumulation_steps);

 private:
  std::shared_ptr<StepController> controller_;
  std::vector<PreparedModel> models_;
  std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers_;
  std::vector<std::shared_ptr<SchedulerCore>> schedulers_;
};

}  // namespace tandem::detail
