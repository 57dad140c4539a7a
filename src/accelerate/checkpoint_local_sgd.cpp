// Checkpointer (checkpointer.h) and LocalSGD: the step count of each live
// LocalSGD, and every rank's own replica and optimizer state.
//
// Between averages each rank's replica differs, and its optimizer state
// (momentum, Adam's moments) differs all along, while a checkpoint's model
// and optimizer sections hold rank 0's. So while a LocalSGD lives every rank
// also writes its own into its rank file, as whole tensors:
//   local_sgd/model/<name>              the model's parameters
//   local_sgd/master/<name>             fp32 masters (bf16/fp16 models)
//   local_sgd/optim/<i>/<state>/<name>  optimizer i's state
// At the same world size load_state reads each rank's back, and the
// LocalSGD that continues (the live one, or the next one constructed) puts
// it in place: the run goes on exactly. Without a LocalSGD to continue, the
// ranks keep rank 0's, which plain DDP needs (equal replicas).

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/checkpointer.h"
#include "accelerate/optimizer_state.h"
#include "tandem/accelerate/local_sgd.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/core/parameters.h"

namespace tandem::detail {

// Calls fn(key, tensor) for every tensor of model `index`'s replica on this
// rank: its parameters, then each optimizer's masters and state (over any
// parameter of the model, or a master of one).
void Checkpointer::for_each_replica_tensor(
    std::size_t index, const std::function<void(const std::string&, const at::Tensor&)>& fn) const {
  const PreparedModel& model = prepared_.models().at(index);
  std::unordered_set<const void*> own;
  for (auto& item : unique_named_parameters(*model.module)) {
    own.insert(item.tensor.unsafeGetTensorImpl());
    fn("local_sgd/model/" + model.prefix + item.name, item.tensor);
  }
  std::unordered_set<const void*> masters;
  for (const MasterWeights* m : prepared_.master_weights()) {
    for (std::size_t i = 0; i < m->model_params().size(); ++i) {
      if (own.count(m->model_params()[i].unsafeGetTensorImpl()) == 0) continue;
      masters.insert(m->master_params()[i].unsafeGetTensorImpl());
    }
  }
  const TensorNames names = tensor_names();
  for (std::size_t i = 0; i < prepared_.optimizers().size(); ++i) {
    AcceleratedOptimizer& optimizer = *prepared_.optimizers()[i];
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) {
        const void* impl = p.unsafeGetTensorImpl();
        if (own.count(impl) == 0 && masters.count(impl) == 0) continue;
        const std::string& name = name_of(names, p, "save_state");
        if (own.count(impl) == 0) fn("local_sgd/master/" + name, p);
        for (const auto& [state, t] : get_param_state(optimizer, p).tensors) {
          fn(fmt::format("local_sgd/optim/{}/{}/{}", i, state, name), t);
        }
      }
    }
  }
}

void Checkpointer::attach_local_sgd(LocalSGD* local_sgd, std::size_t model) {
  local_sgds_.emplace_back(local_sgd, model);
}

void Checkpointer::detach_local_sgd(const LocalSGD* local_sgd) {
  local_sgds_.erase(std::remove_if(local_sgds_.begin(), local_sgds_.end(),
                                   [&](const auto& entry) { return entry.first == local_sgd; }),
                    local_sgds_.end());
}

std::optional<std::pair<int64_t, int64_t>> Checkpointer::take_local_sgd_steps(
    std::size_t model) {
  const auto it = resumed_local_sgd_steps_.find(model);
  if (it == resumed_local_sgd_steps_.end()) return std::nullopt;
  const std::pair<int64_t, int64_t> steps = it->second;
  resumed_local_sgd_steps_.erase(it);
  apply_replica(model);
  return steps;
}

bool Checkpointer::saves_replicas() const {
  if (group_->world_size() == 1) return false;
  for (const auto& [local_sgd, model] : local_sgds_) {
    if (local_sgd->enabled() && model < prepared_.models().size()) return true;
  }
  return false;
}

nlohmann::json Checkpointer::local_sgd_meta() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [local_sgd, model] : local_sgds_) {
    entries.push_back({{"model", model},
                       {"num_steps", local_sgd->num_steps()},
                       {"local_sgd_steps", local_sgd->local_sgd_steps()},
                       {"steps_since_average", local_sgd->steps_since_average()},
                       {"replicas_per_rank", local_sgd->enabled() && saves_replicas()}});
  }
  return entries;
}

void Checkpointer::append_local_sgd_replicas(NamedTensors& out) const {
  if (!saves_replicas()) return;
  std::unordered_set<std::size_t> done;
  for (const auto& [local_sgd, model] : local_sgds_) {
    if (!local_sgd->enabled() || !done.insert(model).second) continue;
    for_each_replica_tensor(model, [&](const std::string& key, const at::Tensor& t) {
      out.emplace_back(key, t.detach().reshape({-1}));
    });
  }
}

void Checkpointer::restore_local_sgd(const CheckpointReader& checkpoint) {
  resumed_local_sgd_steps_.clear();
  pending_replicas_.clear();
  const nlohmann::json& meta = checkpoint.meta();
  if (!meta.contains("local_sgd")) return;
  const bool same_world = checkpoint.world_size() == group_->world_size();
  for (const auto& entry : meta["local_sgd"]) {
    const auto model = entry.at("model").get<std::size_t>();
    if (model >= prepared_.models().size()) continue;
    if (entry.value("replicas_per_rank", false)) {
      if (same_world) {
        // Read now, while the checkpoint is open; put in place when a
        // LocalSGD continues.
        std::map<std::string, at::Tensor>& replica = pending_replicas_[model];
        for_each_replica_tensor(model, [&](const std::string& key, const at::Tensor&) {
          std::optional<at::Tensor> saved = checkpoint.read_rank_tensor(group_->rank(), key);
          TANDEM_CHECK_FILE(saved.has_value(),
                            "load_state: checkpoint '{}' holds every rank's LocalSGD replica, "
                            "but rank {}'s file lacks '{}'; the checkpoint is damaged, or this "
                            "run's optimizer state differs from the saved one",
                            checkpoint.path(), group_->rank(), key);
          replica.emplace(key, *saved);
        });
      } else if (main_process()) {
        log_warn("load_state: checkpoint '{}' holds every rank's own LocalSGD replica and "
                 "optimizer state for model {}, saved by {} ranks; this run has {}, so every "
                 "rank continues from rank 0's",
                 checkpoint.path(), model, checkpoint.world_size(), group_->world_size());
      }
    }
    const auto steps = entry.at("num_steps").get<int64_t>();
    // Rank 0's replica everywhere is averaged, as it were; the ranks' own
    // are as far from their last average as when saved.
    const int64_t since =
        pending_replicas_.count(model) ? entry.value("steps_since_average", int64_t{0}) : 0;
    bool live = false;
    for (const auto& [local_sgd, index] : local_sgds_) {
      if (index != model) continue;
      local_sgd->set_num_steps(steps, since);
      live = true;
    }
    if (live) {
      apply_replica(model);
    } else {
      resumed_local_sgd_steps_[model] = {steps, since};
    }
  }
}

void Checkpointer::apply_replica(std::size_t model) {
  const auto it = pending_replicas_.find(model);
  if (it == pending_replicas_.end()) return;
  const std::map<std::string, at::Tensor> replica = std::move(it->second);
  pending_replicas_.erase(it);
  torch::NoGradGuard no_grad;
  // Parameters and masters in place; optimizer state through
  // set_param_state, which the walk below cannot do from a const tensor.
  for_each_replica_tensor(model, [&](const std::string& key, const at::Tensor& t) {
    if (key.rfind("local_sgd/optim/", 0) == 0) return;
    t.detach().copy_(replica.at(key).view(t.sizes()));
  });
  const TensorNames names = tensor_names();
  for (std::size_t i = 0; i < prepared_.optimizers().size(); ++i) {
    AcceleratedOptimizer& optimizer = *prepared_.optimizers()[i];
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params()) {
        ParamState state = get_param_state(optimizer, p);
        if (state.tensors.empty()) continue;
        const auto name = names.find(p.unsafeGetTensorImpl());
        if (name == names.end()) continue;
        bool found = true;
        for (auto& [state_name, t] : state.tensors) {
          const auto saved =
              replica.find(fmt::format("local_sgd/optim/{}/{}/{}", i, state_name, name->second));
          if (saved == replica.end()) {
            found = false;
            break;
          }
          t = saved->second.view(t.sizes()).to(t.options()).clone();
        }
        if (found) set_param_state(optimizer, p, state);
      }
    }
  }
}

}  // namespace tandem::detail
