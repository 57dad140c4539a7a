#pragma once
// Pieces shared by the gradient reducers (DDP's Reducer, the ZeRO engine):
// the autograd post-hook that reports a parameter's gradient as accumulated,
// and non-view aliases into flat buffers.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>

namespace tandem::detail {

// Runs after AccumulateGrad has added this backward's gradient into .grad and
// calls owner->on_grad_ready(index).
template <typename Owner>
class GradReadyHook : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(Owner* owner, std::size_t index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    owner_->on_grad_ready(index_);
    return outputs;
  }

 private:
  Owner* owner_;
  std::size_t index_;
};

// A contiguous tensor over `flat`'s storage at `offset` with `sizes`, that
// autograd does not treat as a view of `flat` (its own version counter):
// Optimizer::zero_grad(false) calls detach_() on every .grad, which throws
// for views (in 1.13 that was the only zero_grad).
inline at::Tensor flat_alias(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  at::Tensor t = at::empty({0}, flat.options());
  std::vector<std::int64_t> strides(sizes.size(), 1);
  for (std::int64_t d = static_cast<std::int64_t>(sizes.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * sizes[d + 1];
  }
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
  return t;
}

// Makes `grad` (a parameter's .grad) the alias `view` of its slot in a flat
// gradient buffer. When the optimizer set .grad to None or autograd stole a
// fresh tensor, one copy brings the gradient (or zeros) into the slot.
inline void adopt_into(at::Tensor& grad, const at::Tensor& view) {
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  at::NoGradGuard no_grad;
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
  grad = view;
}

}  // namespace tandem::detail
