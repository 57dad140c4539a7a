// PreparedObjects (prepared_objects.h): looking prepared objects up again.

#include "accelerate/prepared_objects.h"

#include "accelerate/step_controller.h"
#include "tandem/core/error.h"

namespace tandem::detail {

PreparedObjects::PreparedObjects() : controller_(std::make_shared<StepController>()) {}

std::size_t PreparedObjects::index_of(const std::shared_ptr<torch::nn::Module>& model,
                                      const char* caller) const {
  for (std::size_t i = 0; i < models_.size(); ++i) {
    if (model != nullptr && models_[i].module == model) return i;
  }
  TANDEM_THROW(UsageError,
               "Accelerator::{}: {} is not a model this Accelerator prepared ({} prepared); pass "
               "the object prepare_model() returned",
               caller, model == nullptr ? "a null model" : "the model given", models_.size());
}

AcceleratedOptimizer& PreparedObjects::only_optimizer(const char* caller) const {
  TANDEM_CHECK_ARG(!optimizers_.empty(),
                   "Accelerator::{}: prepare the optimizer first (prepare() or "
                   "prepare_optimizer())",
                   caller);
  TANDEM_CHECK_ARG(optimizers_.size() == 1,
                   "Accelerator::{}: {} optimizers are prepared; name the one to act on "
                   "(the overload that takes the prepared optimizer)",
                   caller, optimizers_.size());
  return *optimizers_.front();
}

std::vector<std::shared_ptr<torch::nn::Module>> PreparedObjects::modules() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& model : models_) out.push_back(model.module);
  return out;
}

std::vector<const MasterWeights*> PreparedObjects::master_weights() const {
  std::vector<const MasterWeights*> out;
  for (const auto& optimizer : optimizers_) {
    if (const MasterWeights* m = PreparedAccess::core(*optimizer).master_weights()) {
      out.push_back(m);
    }
  }
  return out;
}

void PreparedObjects::clear(int64_t accumulation_steps) {
  models_.clear();
  optimizers_.clear();
  schedulers_.clear();
  // The released objects keep the old controller, shared with them, so
  // nothing they do reaches what is prepared next.
  controller_ = std::make_shared<StepController>(accumulation_steps);
}

}  // namespace tandem::detail
