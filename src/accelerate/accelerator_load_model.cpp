// Weights into a model: Accelerator::zero_init() for building it cut to this
// rank's shards, and load_model_weights() for pretrained weights into a
// prepared model, through the ZeRO shards when it is sharded.

#include <memory>

#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/model_strategy.h"
#include "accelerate/strategy_factory.h"
#include "accelerate/prepared_internals.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {

zero::Init Accelerator::zero_init() const {
  return strategies_->zero_init(device_);
}

void detail::refuse_cut_model_off_host(const torch::nn::Module& model, c10::Device device) {
  for (const auto& p : model.parameters()) {
    TANDEM_CHECK_ARG(holds_memory(p) || p.device() == device,
                     "Accelerator::prepare_model: the model was built under a zero::Init that "
                     "cut its units on {}, and it trains on {}; cut units cannot move. Build it "
                     "under accelerator.zero_init(), which cuts on the training device, or pass "
                     "that device to zero::Init",
                     p.device().str(), device.str());
  }
}

LoadSafetensorsResult Accelerator::load_model_weights(const std::string& path,
                                                      const LoadSafetensorsOptions& options) {
  TANDEM_CHECK_ARG(!models_.empty(), "load_model_weights: prepare the model first");
  return load_model_weights_at(0, path, options);
}

LoadSafetensorsResult Accelerator::load_model_weights(
    const std::shared_ptr<torch::nn::Module>& model, const std::string& path,
    const LoadSafetensorsOptions& options) {
  return load_model_weights_at(check_prepared(model, "load_model_weights"), path, options);
}

LoadSafetensorsResult Accelerator::load_model_weights_at(std::size_t index,
                                                         const std::string& path,
                                                         const LoadSafetensorsOptions& options) {
  std::vector<const MasterWeights*> masters;
  for (const auto& optimizer : optimizers_) {
    if (const MasterWeights* master = optimizer->core_->master_weights()) masters.push_back(master);
  }
  return models_[index].strategy->load_weights(path, options, masters);
}

}  // namespace tandem
