#include "tandem/optim/optimizer_factory.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/core/error.h"
#include "tandem/optim/lamb.h"
#include "tandem/optim/lion.h"

namespace tandem {
namespace {

// The config's betas over the options' defaults.
template <typename Options>
void fill_betas(const OptimizerConfig& config, Options& o) {
  auto betas = o.betas();
  if (config.beta1) std::get<0>(betas) = *config.beta1;
  if (config.beta2) std::get<1>(betas) = *config.beta2;
  o.betas(betas);
}

template <typename Options>
void fill_adam(const OptimizerConfig& config, Options& o) {
  if (config.eps) o.eps(*config.eps);
  if (config.weight_decay) o.weight_decay(*config.weight_decay);
  fill_betas(config, o);
}

}  // namespace

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
  const std::string& type = config.type;
  if (type == "SGD") {
    torch::optim::SGDOptions o(lr);
    if (config.momentum) o.momentum(*config.momentum);
    if (config.dampening) o.dampening(*config.dampening);
    if (config.nesterov) o.nesterov(*config.nesterov);
    if (config.weight_decay) o.weight_decay(*config.weight_decay);
    return std::make_unique<torch::optim::SGD>(std::move(params), o);
  }
  if (type == "AdamW") {
    torch::optim::AdamWOptions o(lr);
    fill_adam(config, o);
    return std::make_unique<torch::optim::AdamW>(std::move(params), o);
  }
  if (type == "Adam") {
    torch::optim::AdamOptions o(lr);
    fill_adam(config, o);
    return std::make_unique<torch::optim::Adam>(std::move(params), o);
  }
  if (type == "Adagrad") {
    torch::optim::AdagradOptions o(lr);
    if (config.lr_decay) o.lr_decay(*config.lr_decay);
    if (config.weight_decay) o.weight_decay(*config.weight_decay);
    if (config.initial_accumulator_value) {
      o.initial_accumulator_value(*config.initial_accumulator_value);
    }
    if (config.eps) o.eps(*config.eps);
    return std::make_unique<torch::optim::Adagrad>(std::move(params), o);
  }
  if (type == "RMSprop") {
    torch::optim::RMSpropOptions o(lr);
    if (config.alpha) o.alpha(*config.alpha);
    if (config.eps) o.eps(*config.eps);
    if (config.weight_decay) o.weight_decay(*config.weight_decay);
    if (config.momentum) o.momentum(*config.momentum);
    if (config.centered) o.centered(*config.centered);
    return std::make_unique<torch::optim::RMSprop>(std::move(params), o);
  }
  if (type == "Lion") {
    LionOptions o(lr);
    if (config.weight_decay) o.weight_decay(*config.weight_decay);
    fill_betas(config, o);
    return std::make_unique<Lion>(std::move(params), o);
  }
  TANDEM_CHECK_ARG(type == "Lamb",
                   "unknown optimizer type \"{}\" (Adam, AdamW, SGD, Adagrad, RMSprop, Lion or "
                   "Lamb)",
                   type);
  LambOptions o(lr);
  fill_adam(config, o);
  if (config.bias_correction) o.bias_correction(*config.bias_correction);
  if (config.eps_inside_sqrt) o.eps_inside_sqrt(*config.eps_inside_sqrt);
  if (config.max_coeff) o.max_coeff(*config.max_coeff);
  if (config.min_coeff) o.min_coeff(*config.min_coeff);
  return std::make_unique<Lamb>(std::move(params), o);
}

}  // namespace tandem
