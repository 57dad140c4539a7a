#pragma once
// Sharded<Impl>: marks a submodule as one ZeRO stage-3 unit, like wrapping a
// module in FSDP. Use it in the model's definition in place of the plain
// module; parameter names, constructor arguments and forward() stay the same:
//
//   struct GptImpl : torch::nn::Module {
//     std::vector<tandem::Sharded<BlockImpl>> blocks;   // was std::vector<Block>
//     ...
//       blocks.push_back(register_module("block" + std::to_string(i),
//                                        tandem::Sharded<BlockImpl>(width, heads)));
//
// Without a ZeRO stage-3 optimizer attached, a Sharded module is the plain
// module (one pointer test per forward). Once a ZeroOptimizer with stage 3
// owns the model, each unit's parameters exist only as a 1/N shard per rank
// between uses: forward() gathers them (the next unit's gather is already
// prefetched), runs, and frees the gathered storage; the gradient flowing
// into forward()'s output gathers them again for backward, and they are
// freed once their gradients have been reduce-scattered. Parameters of
// nested Sharded units belong to the innermost one; parameters outside every
// unit stay whole on each rank (their gradients and optimizer state are still
// partitioned). Typical granularity: one unit per transformer block.
//
// forward() must return a tensor (the backward gather hangs on it).
// Thread-safety: as for the wrapped module.

#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace tandem {

namespace detail {
// The hooks a ZeRO stage-3 optimizer installs on a unit. Implemented in
// src/zero; a Sharded module only forwards to them.
class ShardedUnitHooks {
 public:
  virtual ~ShardedUnitHooks() = default;
  // Makes the unit's parameters whole (waits for a prefetch if one is in
  // flight) and prefetches the next unit's.
  virtual void before_forward() = 0;
  // Frees the gathered parameters and ties `output`'s gradient to a gather
  // before the unit's backward. Returns the tensor to hand on.
  virtual at::Tensor after_forward(at::Tensor output) = 0;
};
}  // namespace detail

// The non-template part that a ZeRO optimizer finds by dynamic_cast while
// walking the module tree.
class ShardedUnit {
 public:
  virtual ~ShardedUnit() = default;
  // Set by the ZeRO optimizer that owns the unit; nullptr detaches.
  void attach_sharding(detail::ShardedUnitHooks* hooks) { hooks_ = hooks; }
  bool sharding_attached() const { return hooks_ != nullptr; }

 protected:
  detail::ShardedUnitHooks* hooks_ = nullptr;
};

template <typename Impl>
class ShardedImpl : public Impl, public ShardedUnit {
 public:
  using Impl::Impl;

  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
    using Output = decltype(Impl::forward(std::forward<Args>(args)...));
    static_assert(std::is_same_v<std::decay_t<Output>, at::Tensor>,
                  "tandem::Sharded<Impl> needs Impl::forward to return a tensor");
    if (hooks_ == nullptr) return Impl::forward(std::forward<Args>(args)...);
    hooks_->before_forward();
    return hooks_->after_forward(Impl::forward(std::forward<Args>(args)...));
  }
};

template <typename Impl>
using Sharded = torch::nn::ModuleHolder<ShardedImpl<Impl>>;

}  // namespace tandem
