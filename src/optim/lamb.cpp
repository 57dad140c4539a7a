#include "tandem/optim/lamb.h"

#include <ATen/ATen.h>
#include <torch/optim/serialize.h>

#include "optim/update_math.h"

namespace tandem {

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups, LambOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<LambOptions>(defaults)) {
  detail::lamb_hyper(defaults, "Lamb");
}

Lamb::Lamb(std::vector<torch::Tensor> params, LambOptions defaults)
    : Lamb(std::vector<torch::optim::OptimizerParamGroup>{
               torch::optim::OptimizerParamGroup(std::move(params))},
           defaults) {}

torch::Tensor Lamb::step(LossClosure closure) {
  return detail::step_each_param<LambOptions, LambParamState>(
      *this, "Lamb", closure,
      [](const torch::Tensor& p) {
        auto fresh = std::make_unique<LambParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        return fresh;
      },
      [](const LambOptions& options, torch::Tensor& p, LambParamState& state) {
        const detail::LambHyper h = detail::lamb_hyper(options, "Lamb");
        state.step(state.step() + 1);
        double p_squares = 0, u_squares = 0;
        at::Tensor u = detail::lamb_direction(p, p.grad(), state.exp_avg(), state.exp_avg_sq(),
                                              h, &p_squares, &u_squares);
        p.add_(u, -detail::lamb_factor(h, state.step(), p_squares, u_squares));
      });
}

void LambOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps_inside_sqrt);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_coeff);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(min_coeff);
}

void LambOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, eps_inside_sqrt);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_coeff);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, min_coeff);
}

void LambParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void LambParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<LambParamState, LambOptions>(archive, *this);
}

}  // namespace tandem
