#pragma once
// What a captured training step (cuda_graph_step.cpp) checks about the
// gradients its backward makes: which parameters it reached (and, from
// optim/fused_adam.h, the layout the fused Adam kernels take). LibTorch
// only, no CUDA header.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>

#include "optim/fused_adam.h"
#include "tandem/core/error.h"

namespace tandem::detail {

[[noreturn]] inline void refuse_untrained_parameter(const at::Tensor& param) {
  TANDEM_THROW(UsageError,
               "cuda_graph: a parameter of shape {} that the eager steps updated got no "
               "gradient in the captured step; a captured step must train the same parameters "
               "every time (or turn cuda_graph off)",
               c10::str(param.sizes()));
}

// With accumulation every parameter holds a gradient before the capture
// (allocated outside it), so whether backward reached one is seen by a hook
// on it, removed again when this object goes.
class ReachedHooks {
 public:
  explicit ReachedHooks(const std::vector<at::Tensor>& params) {
    try {
      for (const auto& param : params) {
        const std::size_t index = reached_.size();
        reached_.push_back(0);
        // An undefined gradient (a function that returned none for it)
        // reaches nothing.
        ids_.push_back(param.register_hook([this, index](const at::Tensor& grad) {
          if (grad.defined()) reached_[index] = 1;
        }));
        params_.push_back(param);
      }
    } catch (...) {
      remove();  // no hook may outlive this object
      throw;
    }
  }
  ~ReachedHooks() { remove(); }
  ReachedHooks(const ReachedHooks&) = delete;
  ReachedHooks& operator=(const ReachedHooks&) = delete;

  // Refuses the first parameter no gradient reached.
  void check() const {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (reached_[i] == 0) refuse_untrained_parameter(params_[i]);
    }
  }

 private:
  void remove() {
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(ids_[i]);
    params_.clear();
    ids_.clear();
  }

  std::vector<at::Tensor> params_;  // those with a hook: ids_[i] is params_[i]'s
  std::vector<unsigned> ids_;
  std::vector<char> reached_;  // written by the backward's hooks, read after it
};

}  // namespace tandem::detail
