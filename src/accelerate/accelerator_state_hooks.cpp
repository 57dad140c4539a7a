// What save_state()/load_state() carry besides the prepared objects: custom
// objects registered for checkpointing (Accelerate's custom_checkpoint_<i>)
// and the pre-hooks that run before a save or a load.
//
// A custom object's state is JSON plus named tensors: the JSON goes into the
// checkpoint's meta.json under "custom_checkpoints" (one entry per object,
// in registration order), the tensors into rank 0's file under
// "custom_checkpoint_<i>/<name>". Rank 0's object is saved, and every rank
// loads it, as Accelerate saves from the main process and loads everywhere.

#include <map>
#include <set>

#include "accelerate/model_strategy.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/core/error.h"

namespace tandem {
namespace detail {

// The pre-hooks by id (ids grow, so a map keeps registration order).
struct StateHooks {
  int64_t next_id = 0;
  std::map<int64_t, Accelerator::StatePreHook> save;
  std::map<int64_t, Accelerator::StatePreHook> load;
};

}  // namespace detail

namespace accelerator_state_hooks_detail {

// register_for_checkpointing(state_dict, load_state_dict).
class FunctionCheckpointable final : public Checkpointable {
 public:
  FunctionCheckpointable(std::function<CustomState()> save,
                         std::function<void(const CustomState&)> load)
      : save_(std::move(save)), load_(std::move(load)) {}
  CustomState state_dict() const override { return save_(); }
  void load_state_dict(const CustomState& state) override { load_(state); }

 private:
  std::function<CustomState()> save_;
  std::function<void(const CustomState&)> load_;
};

std::string custom_key(std::size_t index, const std::string& name) {
  return "custom_checkpoint_" + std::to_string(index) + "/" + name;
}

}  // namespace accelerator_state_hooks_detail

void Accelerator::register_for_checkpointing(std::shared_ptr<Checkpointable> object) {
  TANDEM_CHECK_ARG(object != nullptr, "Accelerator::register_for_checkpointing: the object is null");
  for (const auto& registered : custom_objects_) {
    TANDEM_CHECK_ARG(registered != object,
                     "Accelerator::register_for_checkpointing: this object is already "
                     "registered (as custom_checkpoint_{}); register each object once",
                     &registered - custom_objects_.data());
  }
  custom_objects_.push_back(std::move(object));
}

void Accelerator::register_for_checkpointing(
    std::function<CustomState()> state_dict,
    std::function<void(const CustomState&)> load_state_dict) {
  TANDEM_CHECK_ARG(state_dict != nullptr && load_state_dict != nullptr,
                   "Accelerator::register_for_checkpointing: both state_dict and "
                   "load_state_dict functions are needed");
  register_for_checkpointing(
      std::make_shared<accelerator_state_hooks_detail::FunctionCheckpointable>(
          std::move(state_dict), std::move(load_state_dict)));
}

Accelerator::HookHandle Accelerator::register_save_state_pre_hook(StatePreHook hook) {
  TANDEM_CHECK_ARG(hook != nullptr, "Accelerator::register_save_state_pre_hook: the hook is empty");
  if (!state_hooks_) state_hooks_ = std::make_shared<detail::StateHooks>();
  const int64_t id = state_hooks_->next_id++;
  state_hooks_->save.emplace(id, std::move(hook));
  return HookHandle(state_hooks_, true, id);
}

Accelerator::HookHandle Accelerator::register_load_state_pre_hook(StatePreHook hook) {
  TANDEM_CHECK_ARG(hook != nullptr, "Accelerator::register_load_state_pre_hook: the hook is empty");
  if (!state_hooks_) state_hooks_ = std::make_shared<detail::StateHooks>();
  const int64_t id = state_hooks_->next_id++;
  state_hooks_->load.emplace(id, std::move(hook));
  return HookHandle(state_hooks_, false, id);
}

void Accelerator::HookHandle::remove() {
  const std::shared_ptr<detail::StateHooks> hooks = hooks_.lock();
  if (!hooks) return;
  (save_ ? hooks->save : hooks->load).erase(id_);
}

void Accelerator::run_state_pre_hooks(bool save, const std::string& dir) {
  if (!state_hooks_) return;
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (const auto& model : models_) models.push_back(model.module);
  // A copy: a hook may remove itself (or another) through its handle.
  const auto hooks = save ? state_hooks_->save : state_hooks_->load;
  for (const auto& [id, hook] : hooks) hook(models, dir);
}

nlohmann::json Accelerator::custom_state_meta(
    std::vector<std::pair<std::string, at::Tensor>>* tensors) {
  nlohmann::json entries = nlohmann::json::array();
  for (std::size_t i = 0; i < custom_objects_.size(); ++i) {
    CustomState state = custom_objects_[i]->state_dict();
    nlohmann::json names = nlohmann::json::array();
    std::set<std::string> seen;
    for (auto& [name, tensor] : state.tensors) {
      TANDEM_CHECK_ARG(seen.insert(name).second && tensor.defined(),
                       "save_state: custom_checkpoint_{}'s state_dict() returned tensor '{}' "
                       "twice or undefined; give each tensor one name and a value",
                       i, name);
      names.push_back({{"name", name}, {"shape", tensor.sizes().vec()}});
      tensors->emplace_back(accelerator_state_hooks_detail::custom_key(i, name),
                            tensor.detach().contiguous());
    }
    entries.push_back({{"values", std::move(state.values)}, {"tensors", std::move(names)}});
  }
  return entries;
}

void Accelerator::check_custom_states(const CheckpointReader& checkpoint) const {
  const nlohmann::json& meta = checkpoint.meta();
  const std::size_t saved =
      meta.contains("custom_checkpoints") ? meta["custom_checkpoints"].size() : 0;
  TANDEM_CHECK_ARG(saved == custom_objects_.size(),
                   "load_state: checkpoint '{}' holds {} custom object(s) "
                   "(register_for_checkpointing) but this run registered {}; register the same "
                   "objects, in the same order, before load_state()",
                   checkpoint.path(), saved, custom_objects_.size());
}

void Accelerator::restore_custom_states(const CheckpointReader& checkpoint) {
  if (custom_objects_.empty()) return;
  const nlohmann::json& entries = checkpoint.meta().at("custom_checkpoints");
  for (std::size_t i = 0; i < custom_objects_.size(); ++i) {
    const nlohmann::json& entry = entries.at(i);
    CustomState state;
    state.values = entry.at("values");
    for (const auto& t : entry.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      std::optional<at::Tensor> tensor =
          checkpoint.read_rank_tensor(0, accelerator_state_hooks_detail::custom_key(i, name));
      if (!tensor) {
        TANDEM_THROW(CheckpointError,
                     "load_state: checkpoint '{}' lists tensor '{}' of custom_checkpoint_{} but "
                     "rank 0's file does not hold it; the checkpoint is damaged",
                     checkpoint.path(), name, i);
      }
      state.tensors.emplace_back(name, tensor->view(t.at("shape").get<std::vector<int64_t>>()));
    }
    custom_objects_[i]->load_state_dict(state);
  }
}

}  // namespace tandem
