#include "tandem/optim/lamb.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "optim/update_math.h"
#include "tandem/core/error.h"
#include "tandem/core/torch_types.h"

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
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto* options = dynamic_cast<const LambOptions*>(&group.options());
    TANDEM_CHECK_ARG(options != nullptr,
                     "Lamb: a param group has options of another optimizer; give every group "
                     "LambOptions");
    const detail::LambHyper h = detail::lamb_hyper(*options, "Lamb");
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TANDEM_CHECK_ARG(!p.grad().is_sparse(), "Lamb: sparse gradients are not supported");
      auto& slot = state_[compat::optimizer_state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<LambParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<LambParamState&>(*slot);
      state.step(state.step() + 1);
      double p_squares = 0, u_squares = 0;
      at::Tensor u = detail::lamb_direction(p, p.grad(), state.exp_avg(), state.exp_avg_sq(), h,
                                            &p_squares, &u_squares);
      p.add_(u, -detail::lamb_factor(h, state.step(), p_squares, u_squares));
    }
  }
  return loss;
}

}  // namespace tandem
