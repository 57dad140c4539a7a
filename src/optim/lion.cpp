#include "tandem/optim/lion.h"

#include <ATen/ATen.h>

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

}  // namespace tandem
