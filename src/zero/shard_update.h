#pragma once
// The optimizer update of one rank's shard: Adam, AdamW or SGD with
// torch::optim's semantics and hyperparameters, read from the user's
// optimizer at every step so that schedulers keep working.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace tandem::detail {

enum class UpdateRule { kAdam, kAdamW, kSgd };

struct UpdateHyper {
  double lr = 0.0;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;         // Adam, AdamW
  double momentum = 0.0, dampening = 0.0;                // SGD
  bool nesterov = false;
};

// The rule of `optimizer`; UsageError for other optimizers and for options
// tandem does not shard (amsgrad).
UpdateRule update_rule_of(torch::optim::Optimizer& optimizer);
// Number of state shards the rule keeps (Adam: 2, SGD: 1 with momentum).
int state_count(UpdateRule rule, const std::vector<UpdateHyper>& groups);
// The current hyperparameters of each param group.
std::vector<UpdateHyper> read_hyper(torch::optim::Optimizer& optimizer, UpdateRule rule);

// Updates `master` (fp32) in place from `grad` with `state` (state_count
// tensors of the same length); `step` is the 1-based step number. All four
// are slices of shards on one device. `threads` is for the CPU kernel.
void update_shard(UpdateRule rule, const UpdateHyper& hyper, int64_t step, at::Tensor master,
                  const at::Tensor& grad, std::vector<at::Tensor> state, int threads);

}  // namespace tandem::detail
