#include "tandem/optim/lion.h"

#include <ATen/ATen.h>
#include <torch/optim/serialize.h>

#include "optim/update_math.h"

namespace tandem {

Lion::Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups, LionOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LionOptions>(defaults)) {
  detail::lion_hyper(defaults, "Lion");
}

Lion::Lion(std::vector<torch::Tensor> params, LionOptions defaults)
    : Lion(std::vector<torch::optim::OptimizerParamGroup>{
               torch::optim::OptimizerParamGroup(std::move(params))},
           defaults) {}

torch::Tensor Lion::step(LossClosure closure) {
  return detail::step_each_param<LionOptions, LionParamState>(
      *this, "Lion", closure,
      [](const torch::Tensor& p) {
        auto fresh = std::make_unique<LionParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        return fresh;
      },
      [](const LionOptions& options, torch::Tensor& p, LionParamState& state) {
        detail::lion_update(p, p.grad(), state.exp_avg(), detail::lion_hyper(options, "Lion"));
      });
}

void LionOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
}

void LionOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
}

void LionParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
}

void LionParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
}

void Lion::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

void Lion::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

}  // namespace tandem
