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
// module (one out-of-line check per forward). Once a ZeroOptimizer with stage 3
// owns the model, each unit's parameters exist only as a 1/N shard per rank
// between uses: forward() gathers them (the next unit's gather is already
// prefetched), runs, and frees the gathered storage; the gradient flowing
// into forward()'s output gathers them again for backward, and they are
// freed once their gradients have been reduce-scattered. Parameters of
// nested Sharded units belong to the innermost one; parameters outside every
// unit stay whole on each rank (their gradients and optimizer state are still
// partitioned). Typical granularity: one unit per transformer block.
//
// Built under a tandem::zero::Init guard (tandem/zero/init.h), a unit is cut
// to this rank's shard as soon as it is constructed, so no rank ever holds the
// whole model.
//
// forward() must return a tensor (the backward gather hangs on it).
// Thread-safety: as for the wrapped module.

#include <memory>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace tandem {

namespace detail {
class ShardedUnitHooks;  // what a ZeRO stage-3 optimizer installs (src/zero/sharded_hooks.h)
struct UnitShard;        // a unit cut at construction (src/zero/unit_shard.h)
}  // namespace detail

// The non-template part that a ZeRO optimizer finds by dynamic_cast while
// walking the module tree.
class ShardedUnit {
 public:
  virtual ~ShardedUnit() = default;
  // Set by the ZeRO optimizer that owns the unit; nullptr detaches.
  void attach_sharding(detail::ShardedUnitHooks* hooks) { hooks_ = hooks; }
  bool sharding_attached() const { return hooks_ != nullptr; }

  // Set when a zero::Init guard cut the unit at construction, until a ZeRO
  // optimizer adopts the shard.
  const std::shared_ptr<detail::UnitShard>& construction_shard() const {
    return construction_shard_;
  }
  void set_construction_shard(std::shared_ptr<detail::UnitShard> shard) {
    construction_shard_ = std::move(shard);
  }

 protected:
  // Called once the wrapped module is constructed: cuts the unit to this
  // rank's shard when a zero::Init guard is active on this thread.
  void unit_constructed(torch::nn::Module& module);
  // Before the wrapped forward: true when a ZeRO optimizer owns the unit
  // (its parameters are then whole, and the next unit's gather is
  // prefetched); false for a plain module. Throws UsageError for a unit cut
  // by zero::Init that no optimizer adopted yet.
  bool begin_forward();
  // After the wrapped forward, when begin_forward() returned true: frees the
  // gathered parameters and ties `output`'s gradient to a gather before the
  // unit's backward. Returns the tensor to hand on.
  at::Tensor end_forward(at::Tensor output);

 private:
  detail::ShardedUnitHooks* hooks_ = nullptr;
  std::shared_ptr<detail::UnitShard> construction_shard_;
};

template <typename Impl>
class ShardedImpl : public Impl, public ShardedUnit {
  template <typename... Args>
  static constexpr bool kForwardsToImpl =
      std::is_constructible_v<Impl, Args&&...> &&
      !(sizeof...(Args) == 1 && (std::is_base_of_v<ShardedImpl, std::decay_t<Args>> && ...));

 public:
  // Impl's constructors, followed by the zero::Init cut.
  template <typename... Args, typename = std::enable_if_t<kForwardsToImpl<Args...>>>
  explicit ShardedImpl(Args&&... args) : Impl(std::forward<Args>(args)...) {
    unit_constructed(*this);
  }

  template <typename... Args>
  auto forward(Args&&... args) -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
    using Output = decltype(Impl::forward(std::forward<Args>(args)...));
    static_assert(std::is_same_v<std::decay_t<Output>, at::Tensor>,
                  "tandem::Sharded<Impl> needs Impl::forward to return a tensor");
    if (!begin_forward()) return Impl::forward(std::forward<Args>(args)...);
    return end_forward(Impl::forward(std::forward<Args>(args)...));
  }
};

template <typename Impl>
using Sharded = torch::nn::ModuleHolder<ShardedImpl<Impl>>;

}  // namespace tandem
