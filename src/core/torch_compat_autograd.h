#pragma once
// LibTorch version differences in autograd's internals, kept apart from
// torch_compat.h (which pulls in c10d) so that torch_internals.h stays light.
// Private to the library: include only from src/core/torch_internals.*.

#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>

namespace tandem::compat {

// The owning handle of an autograd node such as a parameter's gradient
// accumulator: std::shared_ptr<Node> up to LibTorch 2.12, and
// c10::intrusive_ptr<Node> from 2.13 on. Whatever grad_accumulator() returns.
using AutogradNodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace tandem::compat
