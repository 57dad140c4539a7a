#pragma once
// Shared by the gradient reducers (DDP's Reducer, the ZeRO engine): a
// parameter's .grad kept as an alias of its slot in a flat gradient buffer
// (internals::flat_alias()).

#include <ATen/ATen.h>

namespace tandem::detail {

// Fills `view`, a parameter's slot in a flat gradient buffer, with the
// gradient the parameter holds (nothing to do when .grad is that slot
// already), or zeros when it holds none. .grad itself is left as it is.
inline void copy_into_slot(const at::Tensor& grad, const at::Tensor& view) {
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  at::NoGradGuard no_grad;
  if (grad.defined()) {
    view.copy_(grad);
  } else {
    view.zero_();
  }
}

// Makes `grad` (a parameter's .grad) the alias `view` of its slot in a flat
// gradient buffer. When the optimizer set .grad to None or autograd stole a
// fresh tensor, one copy brings the gradient (or zeros) into the slot.
inline void adopt_into(at::Tensor& grad, const at::Tensor& view) {
  copy_into_slot(grad, view);
  grad = view;
}

}  // namespace tandem::detail
