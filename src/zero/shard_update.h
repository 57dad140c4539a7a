#pragma once
// The optimizer update of one rank's shard, with the semantics and
// hyperparameters of the user's optimizer (read at every step, so that
// schedulers keep working): torch::optim's Adam, AdamW, SGD, Adagrad and
// RMSprop, tandem's Lion and Lamb, or, through ZeroOptions'
// shard_optimizer_factory, any optimizer that updates each element from its
// own gradient and state.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "optim/update_math.h"

namespace tandem::detail {

enum class UpdateRule { kAdam, kAdamW, kSgd, kAdagrad, kRmsprop, kLion, kLamb, kCustom };

struct UpdateHyper {
  double lr = 0.0;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;         // Adam, AdamW
  double momentum = 0.0, dampening = 0.0;                // SGD, RMSprop (momentum)
  bool nesterov = false;
  double lr_decay = 0.0, initial_accumulator_value = 0.0;  // Adagrad (and eps)
  double alpha = 0.99;                                     // RMSprop (and eps)
  bool centered = false;
  LionHyper lion;
  LambHyper lamb;
};

// The rule of `optimizer` (kCustom when `has_factory`); UsageError for
// optimizers and options tandem does not shard, naming the stage or the
// option that runs them.
UpdateRule update_rule_of(torch::optim::Optimizer& optimizer, bool has_factory);
// The current hyperparameters of each param group (none for kCustom).
std::vector<UpdateHyper> read_hyper(torch::optim::Optimizer& optimizer, UpdateRule rule);
// Names of the state shards the rule keeps, in order: exp_avg and
// exp_avg_sq (Adam, AdamW, Lamb), momentum_buffer (SGD with momentum), sum
// (Adagrad), square_avg then momentum_buffer and grad_avg when some group
// uses them (RMSprop), exp_avg (Lion); the names torch's (and tandem's)
// optimizers give them, so checkpoints move between ZeRO and DDP.
std::vector<std::string> state_names(UpdateRule rule, const std::vector<UpdateHyper>& groups);

// UsageError when `groups` need a state that `kept` (the names at
// construction) lacks: momentum or centered turned on later.
void check_state_kept(UpdateRule rule, const std::vector<UpdateHyper>& groups,
                      const std::vector<std::string>& kept);

// Updates `master` (fp32) in place from `grad` with `state` (the rule's
// state shards, same length); `step` is the 1-based step number. All are
// slices of shards on one device. `threads` is for the CPU Adam kernel.
// Not for kLamb (whose factor needs whole-parameter norms: ShardState) or
// kCustom.
void update_shard(UpdateRule rule, const UpdateHyper& hyper, int64_t step, at::Tensor master,
                  const at::Tensor& grad, std::vector<at::Tensor> state, int threads);

}  // namespace tandem::detail
