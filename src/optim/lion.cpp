#include "tandem/optim/lion.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "optim/update_math.h"
#include "tandem/core/error.h"
#include "tandem/core/torch_types.h"

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
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto* options = dynamic_cast<const LionOptions*>(&group.options());
    TANDEM_CHECK_ARG(options != nullptr,
                     "Lion: a param group has options of another optimizer; give every group "
                     "LionOptions");
    const detail::LionHyper h = detail::lion_hyper(*options, "Lion");
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TANDEM_CHECK_ARG(!p.grad().is_sparse(), "Lion: sparse gradients are not supported");
      auto& slot = state_[compat::optimizer_state_key(p)];
      if (!slot) {
        auto fresh = std::make_unique<LionParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<LionParamState&>(*slot);
      detail::lion_update(p, p.grad(), state.exp_avg(), h);
    }
  }
  return loss;
}

}  // namespace tandem
