// LocalSGD: local optimizer steps under no_sync, parameters averaged every
// K steps (tandem/accelerate/local_sgd.h).

#include "tandem/accelerate/local_sgd.h"

#include <exception>
#include <map>
#include <optional>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/accelerator_impl.h"
#include "accelerate/model_strategy.h"
#include "accelerate/prepared_internals.h"
#include "tandem/amp/master_weights.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {

namespace {

// Every rank's trainable parameters of prepared model `index`, and the fp32
// masters of the optimizers over them, replaced by their mean across ranks.
// Collective.
void average_parameters(const detail::PreparedObjects& prepared, ProcessGroup& world,
                        std::size_t index) {
  const detail::PreparedModel& model = prepared.models().at(index);
  torch::NoGradGuard no_grad;
  // fp32 masters stand in for their bf16/fp16 parameters: average them, and
  // the model takes their rounded values afterwards.
  // Replicated optimizers are not bound to a model (they may span several):
  // take the masters of whichever optimizer holds this model's parameters.
  const std::vector<at::Tensor> params = unique_parameters(*model.module);
  std::unordered_set<const void*> own;
  for (const auto& p : params) own.insert(p.unsafeGetTensorImpl());
  std::vector<std::pair<at::Tensor, at::Tensor>> mastered;  // (model param, master)
  std::unordered_set<const void*> has_master;
  for (const MasterWeights* masters : prepared.master_weights()) {
    for (std::size_t i = 0; i < masters->model_params().size(); ++i) {
      const at::Tensor& p = masters->model_params()[i];
      const at::Tensor& m = masters->master_params()[i];
      if (own.count(p.unsafeGetTensorImpl()) == 0) continue;
      if (p.unsafeGetTensorImpl() == m.unsafeGetTensorImpl()) continue;
      mastered.emplace_back(p, m);
      has_master.insert(p.unsafeGetTensorImpl());
    }
  }
  std::vector<at::Tensor> tensors;
  for (const auto& p : params) {
    if (p.requires_grad() && has_master.count(p.unsafeGetTensorImpl()) == 0) {
      tensors.push_back(p.detach());
    }
  }
  for (const auto& [p, m] : mastered) tensors.push_back(m.detach());
  // One flat all-reduce per (device, dtype), in a fixed order on every rank.
  std::map<std::pair<std::string, int>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{t.device().str(), static_cast<int>(t.scalar_type())}].push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_parts);
    world.all_reduce(flat, ReduceOp::kAvg);
    int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  for (const auto& [p, m] : mastered) p.detach().copy_(m);
}

}  // namespace

LocalSGD::LocalSGD(Accelerator& accelerator, std::shared_ptr<torch::nn::Module> model,
                   int64_t local_sgd_steps, bool enabled)
    : accelerator_(accelerator),
      index_(accelerator.check_prepared(model, "LocalSGD")),
      local_sgd_steps_(local_sgd_steps),
      enabled_(enabled) {
  TANDEM_CHECK_ARG(local_sgd_steps >= 1, "LocalSGD: local_sgd_steps must be >= 1, got {}",
                   local_sgd_steps);
  // Only replicas can drift apart and be averaged back.
  const detail::ModelStrategy& strategy =
      *accelerator.impl_->prepared.models().at(index_).strategy;
  TANDEM_CHECK_ARG(strategy.partitioned() == nullptr,
                   "LocalSGD: [rank {}] the model is sharded with {}, whose shards "
                   "cannot drift apart to be averaged; LocalSGD works with DDP (as Accelerate's "
                   "refuses DeepSpeed). Turn ZeRO off or drop LocalSGD",
                   accelerator.process_index(), strategy.describe());
  if (enabled_) no_sync_.emplace(accelerator.no_sync_at(index_));
  detail::Checkpointer& checkpointer = *accelerator.impl_->checkpointer;
  // A load_state() before this LocalSGD existed left its predecessor's count.
  if (auto resumed = checkpointer.take_local_sgd_steps(index_)) {
    set_num_steps(resumed->first, resumed->second);
  }
  checkpointer.attach_local_sgd(this, index_);
}

LocalSGD::~LocalSGD() {
  accelerator_.impl_->checkpointer->detach_local_sgd(this);
  if (finished_) return;
  if (std::uncaught_exceptions() > 0) {
    no_sync_.reset();
    return;
  }
  try {
    finish();
  } catch (...) {
    // A destructor must not throw; call finish() to see the error.
  }
}

void LocalSGD::step() {
  TANDEM_CHECK_ARG(!finished_, "LocalSGD::step: finish() already ran; make a new LocalSGD");
  ++num_steps_;
  if (!enabled_ || num_steps_ % local_sgd_steps_ != 0) return;
  average_parameters(accelerator_.impl_->prepared, *accelerator_.impl_->group, index_);
  averaged_at_ = num_steps_;
}

void LocalSGD::set_num_steps(int64_t num_steps, int64_t steps_since_average) {
  TANDEM_CHECK_ARG(!finished_,
                   "LocalSGD::set_num_steps: finish() already ran; make a new LocalSGD");
  TANDEM_CHECK_ARG(num_steps >= 0 && steps_since_average >= 0 && steps_since_average <= num_steps,
                   "LocalSGD::set_num_steps: got {} steps, the last average {} steps ago; both "
                   "must be >= 0, the second at most the first",
                   num_steps, steps_since_average);
  num_steps_ = num_steps;
  averaged_at_ = num_steps - steps_since_average;
}

void LocalSGD::finish() {
  if (finished_) return;
  finished_ = true;
  // Saved from here on, the replicas are averaged and no LocalSGD goes on.
  accelerator_.impl_->checkpointer->detach_local_sgd(this);
  if (!enabled_) return;
  // Always, as Accelerate's __exit__: the optimizer may have stepped
  // without step() being called.
  average_parameters(accelerator_.impl_->prepared, *accelerator_.impl_->group, index_);
  averaged_at_ = num_steps_;
  no_sync_.reset();
}

}  // namespace tandem
