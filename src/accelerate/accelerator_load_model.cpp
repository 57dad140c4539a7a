// Weights into a model: Accelerator::zero_init() for building it cut to this
// rank's shards, and load_model_weights() for pretrained weights into a
// prepared model, through the ZeRO shards when it is sharded.

#include <exception>
#include <memory>
#include <unordered_map>

#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/prepared_internals.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/safetensors_set.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/zero/zero_weights.h"

namespace tandem {

zero::Init Accelerator::zero_init() const {
  if (config_.zero.stage != 3 || !config_.zero.zero3_init) return zero::Init::disabled();
  return zero::Init(*process_group_, config_.zero.stage3_param_persistence_threshold, device_);
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
  if (const std::shared_ptr<ZeroOptimizer>& zero = models_[index].zero) {
    return load_safetensors_into_shards(*zero, path, options);
  }
  torch::nn::Module& model = *models_[index].module;
  LoadSafetensorsResult result;
  std::string error;
  std::exception_ptr own;
  try {
    result = load_safetensors(model, path, options);
    // The optimizer steps fp32 masters of bf16/fp16 parameters: they take
    // the file's values too (at the file's precision, not the rounded one).
    std::unordered_map<const void*, std::vector<std::string>> names;
    for (auto& p : unique_named_parameters(model)) {
      std::vector<std::string>& all = names[p.tensor.unsafeGetTensorImpl()];
      all.push_back(p.name);
      all.insert(all.end(), p.aliases.begin(), p.aliases.end());
    }
    std::unique_ptr<SafetensorsSet> set;
    torch::NoGradGuard no_grad;
    for (const auto& optimizer : optimizers_) {
      const MasterWeights* master = optimizer->core_->master_weights();
      if (master == nullptr) continue;
      for (std::size_t i = 0; i < master->model_params().size(); ++i) {
        const at::Tensor& m = master->master_params()[i];
        const auto it = names.find(master->model_params()[i].unsafeGetTensorImpl());
        if (it == names.end() || m.unsafeGetTensorImpl() == it->first) continue;
        if (!set) set = std::make_unique<SafetensorsSet>(path);
        for (const auto& name : it->second) {
          if (set->find(options.prefix + name) == nullptr) continue;
          set->read_range_into(options.prefix + name, 0, m.detach());
          break;
        }
      }
    }
    if (set) result.bytes_read += set->bytes_read();
  } catch (const std::exception& e) {
    error = e.what();
    own = std::current_exception();
  }
  // Ranks read the same files, so they normally fail alike; agreeing keeps
  // one odd rank (a missing mount) from leaving the others in a collective.
  const std::vector<std::string> errors = process_group_->all_gather_strings(error);
  if (own) std::rethrow_exception(own);
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    TANDEM_THROW(CheckpointError, "load_model_weights: [rank {}/{}] {}", r, errors.size(),
                 errors[r]);
  }
  return result;
}

}  // namespace tandem
