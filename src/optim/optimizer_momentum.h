#pragma once
// Reads and writes "the momentum" of a LibTorch param group, for OneCycle:
// beta1 for Adam, AdamW, Lion and Lamb, momentum for SGD and RMSprop.

#include <string>

#include <torch/optim/optimizer.h>

namespace tandem::detail {

// True when `options` belongs to an optimizer with a momentum OneCycle can
// cycle (those above).
bool has_momentum(const torch::optim::OptimizerOptions& options);

// The momentum (beta1 or SGD momentum). Requires has_momentum(options).
double get_momentum(const torch::optim::OptimizerOptions& options);

// Sets beta1 (keeping beta2) or the momentum. Requires has_momentum(options).
void set_momentum(torch::optim::OptimizerOptions& options, double momentum);

// The options' C++ type, e.g. "torch::optim::RMSpropOptions", for messages.
std::string options_type_name(const torch::optim::OptimizerOptions& options);

}  // namespace tandem::detail
