#pragma once
// Builds the torch::optim optimizer that a DeepSpeed/tandem config's
// `optimizer` block describes ({"type": "AdamW", "params": {...}}).

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include "tandem/config/config.h"

namespace tandem {

// An Adam, AdamW, SGD, Adagrad, RMSprop (torch::optim), Lion or Lamb
// (tandem/optim/lion.h, lamb.h) over `params` with the block's settings; values left
// out (or "auto") take torch's defaults (DeepSpeed's for Lion and Lamb), and lr takes `default_lr` when > 0.
// UsageError when the config has no optimizer block or no lr anywhere.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<at::Tensor> params,
                                                        double default_lr = 0.0);

}  // namespace tandem
