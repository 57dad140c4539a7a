#pragma once
// Checkpointer: the Accelerator's checkpoints. save_state/load_state (what a
// checkpoint holds and how it maps onto the prepared objects: models and
// their shards, optimizers, schedulers, loss scaler, training loader
// position, RNG states), the state pre-hooks and the custom objects
// registered for checkpointing, which it owns, and the model's weights on
// their own (save_model, load_model_weights). The directory layout and the
// commit protocol are tandem/checkpoint/checkpoint.h's.
//
//   checkpointer.cpp         save_state, load_state, hooks, custom objects
//   checkpoint_local_sgd.cpp LocalSGD's step count and every rank's replica
//   checkpoint_contents.cpp  the metadata and tensors saved, and their restore
//   comm_hook_state.cpp      a DDP communication hook's state (PowerSGD)
//   model_weights_io.cpp     save_model, load_model_weights
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.
// save_state, load_state, save_model and load_model_weights are collective.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "accelerate/checkpoint_layout.h"
#include "accelerate/data_preparation.h"
#include "accelerate/prepared_objects.h"
#include "tandem/accelerate/accelerator_options.h"
#include "tandem/accelerate/checkpointable.h"
#include "tandem/amp/loss_scaler.h"
#include "tandem/checkpoint/module_weights.h"
#include "tandem/config/config.h"

namespace tandem {

class CheckpointReader;
class LocalSGD;
class ProcessGroup;

namespace detail {

// The state pre-hooks by id (ids grow, so a map keeps registration order).
// Shared with the Accelerator's HookHandles, which hold it weakly.
struct StateHooks {
  using Hook = std::function<void(const std::vector<std::shared_ptr<torch::nn::Module>>& models,
                                  const std::string& dir)>;
  int64_t next_id = 0;
  std::map<int64_t, Hook> save;
  std::map<int64_t, Hook> load;
};

// Accelerator::register_for_checkpointing(state_dict, load_state_dict): the
// pair as a Checkpointable. UsageError when either is empty.
std::shared_ptr<Checkpointable> function_checkpointable(
    std::function<CustomState()> state_dict,
    std::function<void(const CustomState&)> load_state_dict);

class Checkpointer {
 public:
  // `config` is the Accelerator's resolved config, read at each call.
  // `save_on_each_node`: Accelerate's ProjectConfiguration flag
  // (CheckpointCommitOptions::save_on_each_node).
  Checkpointer(std::shared_ptr<ProcessGroup> group, const Config& config,
               std::shared_ptr<LossScaler> scaler, PreparedObjects& prepared,
               const DataPreparation& data, bool save_on_each_node);

  // True when DIR holds a committed checkpoint that load_state would load.
  static bool has_checkpoint(const std::string& dir);
  void save_state(const std::string& dir, const SaveStateOptions& options);
  nlohmann::json load_state(const std::string& dir, const LoadStateOptions& options);

  void register_object(std::shared_ptr<Checkpointable> object);
  // Registers `hook` to run before every save (`save`) or load; returns its
  // id in hooks().
  int64_t register_pre_hook(bool save, StateHooks::Hook hook);
  const std::shared_ptr<StateHooks>& hooks() const { return hooks_; }

  // LocalSGD (local_sgd.cpp; checkpoint_local_sgd.cpp). While one lives
  // (attached until it finishes), save_state records its step count and
  // every rank's own replica and optimizer state. load_state hands them to
  // the live LocalSGD of that model, or keeps them for the next one
  // constructed, which takes them with take_local_sgd_steps() (the count;
  // the replica is put in place then).
  void attach_local_sgd(LocalSGD* local_sgd, std::size_t model);
  void detach_local_sgd(const LocalSGD* local_sgd);
  // (num_steps, steps since its last average), as set_num_steps() takes them.
  std::optional<std::pair<int64_t, int64_t>> take_local_sgd_steps(std::size_t model);

  // Prepared model `index`'s consolidated weights as DIR/model.safetensors.
  void save_model(std::size_t index, const std::string& dir, const std::string& max_shard_size);
  // Pretrained weights into prepared model `index`.
  LoadSafetensorsResult load_model_weights(std::size_t index, const std::string& path,
                                           const LoadSafetensorsOptions& options);

 private:
  bool main_process() const;
  void run_pre_hooks(bool save, const std::string& dir);
  // Custom objects: rank 0's saved, every rank's restored.
  nlohmann::json custom_state_meta(NamedTensors* tensors);
  void check_custom_states(const CheckpointReader& checkpoint) const;
  // Opens DIR's checkpoint on every rank and checks that all opened the same
  // one (collective; CheckpointError on every rank otherwise).
  CheckpointReader open_agreed(const std::string& dir, const LoadStateOptions& options) const;
  void restore_custom_states(const CheckpointReader& checkpoint);
  // What a checkpoint holds (checkpoint_contents.cpp). Every prepared
  // model's parameters (and the optimizers' fp32 masters) by checkpoint
  // name, keyed by TensorImpl.
  TensorNames tensor_names() const;
  nlohmann::json state_meta(const SaveStateOptions& options) const;
  // `writes_whole`: this rank writes the tensors that are not partitioned
  // (rank 0, and each host's local main with save_on_each_node).
  NamedTensors state_tensors(bool writes_whole) const;
  // Weights (and, under ZeRO, with `optimizer_states` the optimizer's
  // shards too: they live beside the weights).
  void restore_models(const CheckpointReader& checkpoint, bool optimizer_states);
  void restore_optimizers(const CheckpointReader& checkpoint);
  void restore_progress(const CheckpointReader& checkpoint, const LoadStateOptions& options);
  // The models' DDP communication hook state (comm_hook_state.h).
  void restore_communication(const CheckpointReader& checkpoint);
  // LocalSGD (checkpoint_local_sgd.cpp): meta.json's "local_sgd", every
  // rank's replica tensors, their restore and their putting in place.
  bool saves_replicas() const;
  void for_each_replica_tensor(
      std::size_t model,
      const std::function<void(const std::string&, const at::Tensor&)>& fn) const;
  nlohmann::json local_sgd_meta() const;
  void append_local_sgd_replicas(NamedTensors& out) const;
  void restore_local_sgd(const CheckpointReader& checkpoint);
  void apply_replica(std::size_t model);

  std::shared_ptr<ProcessGroup> group_;
  const Config& config_;
  std::shared_ptr<LossScaler> scaler_;
  PreparedObjects& prepared_;
  const DataPreparation& data_;
  bool save_on_each_node_ = false;
  // register_for_checkpointing() objects, in order, and the pre-hooks.
  std::vector<std::shared_ptr<Checkpointable>> custom_objects_;
  std::shared_ptr<StateHooks> hooks_ = std::make_shared<StateHooks>();
  // Live LocalSGDs with their model's index, and the step counts the last
  // load_state() left for models without one.
  std::vector<std::pair<LocalSGD*, std::size_t>> local_sgds_;
  std::map<std::size_t, std::pair<int64_t, int64_t>> resumed_local_sgd_steps_;
  // This rank's replica tensors read by the last load_state(), by model,
  // until a LocalSGD continues it.
  std::map<std::size_t, std::map<std::string, at::Tensor>> pending_replicas_;
};

}  // namespace detail
}  // namespace tandem
