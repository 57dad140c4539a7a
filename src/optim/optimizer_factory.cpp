#include "tandem/optim/optimizer_factory.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "tandem/core/error.h"

namespace tandem {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<at::Tensor> params,
                                                        double default_lr) {
  TANDEM_CHECK_ARG(!config.type.empty(),
                   "the config has no `optimizer` block; add one (e.g. {{\"type\": \"AdamW\", "
                   "\"params\": {{\"lr\": 0.001}}}}) or build the optimizer in code");
  const double lr = config.lr.value_or(default_lr);
  TANDEM_CHECK_ARG(lr > 0,
                   "the config's {} optimizer has no lr (or \"auto\"), and none was given in "
                   "code; set optimizer.params.lr",
                   config.type);
  if (config.type == "SGD") {
    torch::optim::SGDOptions o(lr);
    if (config.momentum) o.momentum(*config.momentum);
    if (config.weight_decay) o.weight_decay(*config.weight_decay);
    return std::make_unique<torch::optim::SGD>(std::move(params), o);
  }
  auto fill = [&](auto& o) {
    if (config.eps) o.eps(*config.eps);
    if (config.weight_decay) o.weight_decay(*config.weight_decay);
    auto betas = o.betas();
    if (config.beta1) std::get<0>(betas) = *config.beta1;
    if (config.beta2) std::get<1>(betas) = *config.beta2;
    o.betas(betas);
  };
  if (config.type == "AdamW") {
    torch::optim::AdamWOptions o(lr);
    fill(o);
    return std::make_unique<torch::optim::AdamW>(std::move(params), o);
  }
  TANDEM_CHECK_ARG(config.type == "Adam", "unknown optimizer type \"{}\" (Adam, AdamW or SGD)",
                   config.type);
  torch::optim::AdamOptions o(lr);
  fill(o);
  return std::make_unique<torch::optim::Adam>(std::move(params), o);
}

}  // namespace tandem
