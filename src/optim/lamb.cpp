#include "tandem/optim/lamb.h"

#include <ATen/ATen.h>

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

}  // namespace tandem
