// Checkpointer (checkpointer.h): save_state and load_state around the
// contents (checkpoint_contents.cpp), the state pre-hooks, and the custom
// objects registered for checkpointing.
//
// A custom object's state is JSON plus named tensors: the JSON goes into the
// checkpoint's meta.json under "custom_checkpoints" (one entry per object,
// in registration order), the tensors into rank 0's file under
// "custom_checkpoint_<i>/<name>". Rank 0's object is saved, and every rank
// loads it, as Accelerate saves from the main process and loads everywhere.

#include "accelerate/checkpointer.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "accelerate/step_controller.h"
#include "comm/agreement.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace checkpointer_detail {

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

}  // namespace checkpointer_detail

std::shared_ptr<Checkpointable> function_checkpointable(
    std::function<CustomState()> state_dict,
    std::function<void(const CustomState&)> load_state_dict) {
  TANDEM_CHECK_ARG(state_dict != nullptr && load_state_dict != nullptr,
                   "Accelerator::register_for_checkpointing: both state_dict and "
                   "load_state_dict functions are needed");
  return std::make_shared<checkpointer_detail::FunctionCheckpointable>(
      std::move(state_dict), std::move(load_state_dict));
}

Checkpointer::Checkpointer(std::shared_ptr<ProcessGroup> group, const Config& config,
                           std::shared_ptr<LossScaler> scaler, PreparedObjects& prepared,
                           const DataPreparation& data, bool save_on_each_node)
    : group_(std::move(group)),
      config_(config),
      scaler_(std::move(scaler)),
      prepared_(prepared),
      data_(data),
      save_on_each_node_(save_on_each_node) {}

bool Checkpointer::main_process() const { return group_->rank() == 0; }

void Checkpointer::save_state(const std::string& dir, const SaveStateOptions& options) {
  TANDEM_CHECK_ARG(!prepared_.models().empty(),
                   "save_state({}): no model is prepared. A checkpoint holds the models' "
                   "weights with the optimizer, scheduler and data position; prepare the "
                   "model(s) with prepare_model() (or prepare()) before saving",
                   dir);
  TANDEM_CHECK_ARG(!prepared_.controller()->gradients_pending(),
                   "save_state() was called in the middle of gradient accumulation (after "
                   "backward(), before the optimizer step that consumes the gradients). A "
                   "checkpoint holds no partial gradients, so resuming would lose them: call "
                   "save_state() after optimizer->step() on a step where sync_gradients() is "
                   "true");
  run_pre_hooks(/*save=*/true, dir);
  const int64_t step = prepared_.controller()->state().optimizer_steps;
  const std::string tag = options.tag.empty() ? "global_step" + std::to_string(step) : options.tag;
  nlohmann::json meta = main_process() ? state_meta(options) : nlohmann::json::object();
  // Rank 0 writes what is not partitioned; with save_on_each_node so does
  // every host's local main (its lowest rank), for its host's folder.
  bool writes_whole = main_process();
  if (save_on_each_node_) {
    const std::vector<std::string> hosts = group_->host_ids();
    writes_whole = std::find(hosts.begin(), hosts.end(), hosts[group_->rank()]) -
                       hosts.begin() == group_->rank();
  }
  if (main_process()) meta["local_sgd"] = local_sgd_meta();
  NamedTensors custom;  // the custom objects' tensors
  if (writes_whole) {
    nlohmann::json custom_meta = custom_state_meta(&custom);
    if (main_process()) meta["custom_checkpoints"] = std::move(custom_meta);
  }
  CheckpointCommitOptions commit;
  commit.total_limit = options.total_limit;
  commit.save_on_each_node = save_on_each_node_;
  commit_checkpoint(
      *group_, dir, tag,
      [this, &custom, writes_whole] {
        NamedTensors out = state_tensors(writes_whole);
        out.insert(out.end(), custom.begin(), custom.end());
        return out;
      },
      std::move(meta), commit);
}

nlohmann::json Checkpointer::load_state(const std::string& dir, const LoadStateOptions& options) {
  TANDEM_CHECK_ARG(!prepared_.models().empty(),
                   "load_state: prepare the model (and optimizer, schedulers, data) first; "
                   "the checkpoint is loaded into the prepared objects");
  run_pre_hooks(/*save=*/false, dir);
  CheckpointReader checkpoint = open_agreed(dir, options);  // before anything changes
  // What follows reads each rank's own files and runs the user's objects,
  // which may fail on one rank alone; the ranks agree on the outcome at the
  // end, so that none returns (and trains on) while another has failed.
  // Nothing in between is a collective that a failed rank skips: ZeRO's
  // shard loads finish their all-gathers before they rethrow.
  const std::string failed = rank_failures(run_agreed(*group_, [&] {
    restore_models(checkpoint, options.load_optimizer_states);
    if (options.load_optimizer_states && !prepared_.optimizers().empty()) {
      restore_optimizers(checkpoint);
    }
    restore_progress(checkpoint, options);
    restore_communication(checkpoint);
    restore_local_sgd(checkpoint);
    restore_custom_states(checkpoint);
  }));
  TANDEM_CHECK_FILE(failed.empty(),
                    "load_state('{}'): another rank failed to load its part of the checkpoint, "
                    "so this one stops too (its state is partly loaded):{}",
                    dir, failed);
  return checkpoint.meta().value("client_state", nlohmann::json::object());
}

// Each rank opens the checkpoint itself: with save_on_each_node, each host
// its own copy, which may be missing, older or damaged there alone. The
// ranks agree before any collective of the load, so that such a host stops
// every rank at once with the reason rather than leaving the others to time
// out in a collective it never joins.
CheckpointReader Checkpointer::open_agreed(const std::string& dir,
                                           const LoadStateOptions& options) const {
  std::optional<CheckpointReader> checkpoint;
  std::exception_ptr failure;
  std::string mine;
  try {
    checkpoint.emplace(dir, options.tag);
    check_custom_states(*checkpoint);
    mine = fmt::format("ok {} (meta.json {:016x})", checkpoint->tag(),
                       std::hash<std::string>{}(checkpoint->meta().dump()));
  } catch (const std::exception& e) {
    failure = std::current_exception();
    mine = std::string("error ") + e.what();
  }
  const std::vector<std::string> all = group_->all_gather_strings(mine);
  std::string errors;
  std::map<std::string, std::vector<int>> opened;  // what -> ranks
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].rfind("error ", 0) == 0) {
      errors += fmt::format("\n  rank {}: {}", r, all[r].substr(6));
    } else {
      opened[all[r].substr(3)].push_back(static_cast<int>(r));
    }
  }
  if (failure) std::rethrow_exception(failure);
  TANDEM_CHECK_FILE(errors.empty(),
                    "load_state('{}'): not every rank can read the checkpoint, so none loads "
                    "it:{}",
                    dir, errors);
  if (opened.size() > 1) {
    std::vector<std::pair<std::vector<int>, std::string>> by_rank;  // lowest rank first
    for (const auto& [what, ranks] : opened) by_rank.emplace_back(ranks, what);
    std::sort(by_rank.begin(), by_rank.end());
    std::string which;
    for (const auto& [ranks, what] : by_rank) {
      which += fmt::format("\n  ranks {}: {}", fmt::join(ranks, ", "), what);
    }
    TANDEM_THROW(CheckpointError,
                 "load_state('{}'): the ranks opened different checkpoints:{}\nEach host reads "
                 "DIR on its own file system (with save_on_each_node, its own copy): give every "
                 "host the same save, or name one with LoadStateOptions::tag",
                 dir, which);
  }
  return std::move(*checkpoint);
}

void Checkpointer::register_object(std::shared_ptr<Checkpointable> object) {
  TANDEM_CHECK_ARG(object != nullptr,
                   "Accelerator::register_for_checkpointing: the object is null");
  for (const auto& registered : custom_objects_) {
    TANDEM_CHECK_ARG(registered != object,
                     "Accelerator::register_for_checkpointing: this object is already "
                     "registered (as custom_checkpoint_{}); register each object once",
                     &registered - custom_objects_.data());
  }
  custom_objects_.push_back(std::move(object));
}

int64_t Checkpointer::register_pre_hook(bool save, StateHooks::Hook hook) {
  TANDEM_CHECK_ARG(hook != nullptr, "Accelerator::register_{}_state_pre_hook: the hook is empty",
                   save ? "save" : "load");
  const int64_t id = hooks_->next_id++;
  (save ? hooks_->save : hooks_->load).emplace(id, std::move(hook));
  return id;
}

void Checkpointer::run_pre_hooks(bool save, const std::string& dir) {
  const std::vector<std::shared_ptr<torch::nn::Module>> models = prepared_.modules();
  // A copy: a hook may remove itself (or another) through its handle.
  const auto hooks = save ? hooks_->save : hooks_->load;
  for (const auto& [id, hook] : hooks) hook(models, dir);
}

nlohmann::json Checkpointer::custom_state_meta(NamedTensors* tensors) {
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
      tensors->emplace_back(checkpointer_detail::custom_key(i, name),
                            tensor.detach().contiguous());
    }
    entries.push_back({{"values", std::move(state.values)}, {"tensors", std::move(names)}});
  }
  return entries;
}

void Checkpointer::check_custom_states(const CheckpointReader& checkpoint) const {
  const nlohmann::json& meta = checkpoint.meta();
  const std::size_t saved =
      meta.contains("custom_checkpoints") ? meta["custom_checkpoints"].size() : 0;
  TANDEM_CHECK_ARG(saved == custom_objects_.size(),
                   "load_state: checkpoint '{}' holds {} custom object(s) "
                   "(register_for_checkpointing) but this run registered {}; register the same "
                   "objects, in the same order, before load_state()",
                   checkpoint.path(), saved, custom_objects_.size());
}

void Checkpointer::restore_custom_states(const CheckpointReader& checkpoint) {
  if (custom_objects_.empty()) return;
  const nlohmann::json& entries = checkpoint.meta().at("custom_checkpoints");
  for (std::size_t i = 0; i < custom_objects_.size(); ++i) {
    const nlohmann::json& entry = entries.at(i);
    CustomState state;
    state.values = entry.at("values");
    for (const auto& t : entry.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      std::optional<at::Tensor> tensor =
          checkpoint.read_main_tensor(checkpointer_detail::custom_key(i, name));
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

}  // namespace tandem::detail
