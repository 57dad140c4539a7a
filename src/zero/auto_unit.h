#pragma once
// The pass-through unit auto_wrap() puts in a torch::nn::Sequential in place
// of an element (tandem/zero/auto_wrap.h), and how the layout finds it.

#include <memory>
#include <unordered_map>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/module.h>

#include "tandem/zero/sharded.h"

namespace tandem::detail {

class AutoUnitImpl : public torch::nn::Module, public ShardedUnit {
 public:
  explicit AutoUnitImpl(torch::nn::AnyModule inner)
      : inner_(std::move(inner)), wrapped_(inner_.ptr()) {}
  at::Tensor forward(at::Tensor x) {
    if (!begin_forward()) return inner_.forward(std::move(x));
    return end_forward(inner_.forward(std::move(x)));
  }
  torch::nn::Module& wrapped() const { return *wrapped_; }

 private:
  torch::nn::AnyModule inner_;
  std::shared_ptr<torch::nn::Module> wrapped_;
};

// The units auto_wrap() put in `model`'s Sequentials, by the module each
// wraps.
std::unordered_map<const torch::nn::Module*, ShardedUnit*> auto_units(torch::nn::Module& model);

}  // namespace tandem::detail
