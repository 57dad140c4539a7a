#pragma once
// Activation checkpointing: run a block's forward without keeping the
// activations its backward needs, and run the forward again in backward to
// get them back. Activation memory drops from every layer's to the blocks'
// inputs plus one block's worth at a time, for about one more forward pass.
// LibTorch has no torch.utils.checkpoint; this is its reentrant variant.
//
//   // One call; tensor arguments get gradients, others are copied:
//   auto y = tandem::checkpoint([&](const torch::Tensor& h, int64_t k) {
//     return block->forward(h, k);
//   }, x, 3);
//
//   // Or mark blocks in the model's definition, as with tandem::Sharded
//   // (parameter names, constructor arguments and forward() stay the same),
//   // and switch them on by code or by the config's activation_checkpointing:
//   std::vector<tandem::Checkpointed<BlockImpl>> blocks;   // was std::vector<Block>
//   tandem::set_activation_checkpointing(*model, true);
//   // With ZeRO stage 3: tandem::Sharded<tandem::CheckpointedImpl<BlockImpl>>.
//
// What is the same as without checkpointing, bit for bit on the CPU: the
// outputs, every gradient (of the tensor arguments and of the parameters the
// block uses), and the random numbers drawn. The CPU generator's state (and
// that of each CUDA device an input lives on) is saved before the forward and
// put back for the recompute, so dropout masks match, then restored, so the
// run's random stream goes on as if nothing had been recomputed. The
// recompute runs under the autocast state of the forward, not the one around
// backward. Parameters receive their gradients through their own
// AccumulateGrad nodes, so DDP's bucket hooks and ZeRO's reduce-scatter see
// them as usual (a block run twice per forward gives its parameters two, one
// per pass: DDP needs static_graph for that, ZeRO counts them, docs/zero.md);
// ZeRO-3 units inside or around a checkpointed block are gathered for the
// recompute and released after it.
//
// Limits, as torch's reentrant checkpoint: backward must be a plain
// loss.backward() (torch::autograd::grad(), backward with `inputs` or
// create_graph is refused with UsageError); a tensor the function reaches other
// than through its arguments (a capture, a member) gets a gradient only if it
// is a leaf (a parameter); the function must not change its arguments in
// place, and must return the same number of tensors when run again.
//
// Thread-safety: as for the wrapped function; the RNG save and restore touch
// the process-wide default generators, so rank threads that checkpoint random
// ops at the same time interleave their streams (as they would anyway).

#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/config/config.h"

namespace tandem {

struct CheckpointOptions {
  // Save the random generators' states before the forward and replay them in
  // the recompute (dropout draws the same masks). false skips the save for a
  // block that draws no random numbers; one that does would then draw
  // different numbers in the recompute, and get wrong gradients.
  bool preserve_rng_state = true;
};

// A block as checkpoint_tensors() runs it: the inputs, in order (undefined
// tensors stay undefined), to the outputs.
using CheckpointFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// The type-erased form of checkpoint(): runs `fn(inputs)` without recording
// its graph and returns its outputs, whose backward runs `fn` again and
// backpropagates through it. With grad mode off it just returns fn(inputs).
// Outputs may be undefined tensors (they stay so) or tensors that need no
// gradient. Throws what `fn` throws; in backward, UsageError for the limits
// above and when the recompute returns another number of tensors.
std::vector<at::Tensor> checkpoint_tensors(CheckpointFunction fn, std::vector<at::Tensor> inputs,
                                           const CheckpointOptions& options = {});

namespace detail {

template <typename T>
inline constexpr bool kCheckpointDependentFalse = false;

// How a block's return value becomes a list of tensors and back.
template <typename R>
struct CheckpointResult {
  static_assert(kCheckpointDependentFalse<R>,
                "tandem::checkpoint: the function must return at::Tensor, "
                "std::vector<at::Tensor> or a std::tuple of at::Tensor");
};

template <>
struct CheckpointResult<at::Tensor> {
  static std::vector<at::Tensor> to_list(at::Tensor t) {
    std::vector<at::Tensor> out;
    out.push_back(std::move(t));
    return out;
  }
  static at::Tensor from_list(std::vector<at::Tensor> list) { return std::move(list.at(0)); }
};

template <>
struct CheckpointResult<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> to_list(std::vector<at::Tensor> list) { return list; }
  static std::vector<at::Tensor> from_list(std::vector<at::Tensor> list) { return list; }
};

template <typename... Ts>
struct CheckpointResult<std::tuple<Ts...>> {
  static_assert((std::is_same_v<Ts, at::Tensor> && ...),
                "tandem::checkpoint: a returned std::tuple may hold only at::Tensor");
  static std::vector<at::Tensor> to_list(std::tuple<Ts...> t) {
    return std::apply([](auto&... x) { return std::vector<at::Tensor>{std::move(x)...}; }, t);
  }
  static std::tuple<Ts...> from_list(std::vector<at::Tensor> list) {
    return from(list, std::index_sequence_for<Ts...>{});
  }
  template <std::size_t... I>
  static std::tuple<Ts...> from(std::vector<at::Tensor>& list, std::index_sequence<I...>) {
    return std::tuple<Ts...>(std::move(list.at(I))...);
  }
};

// Arguments that would hold tensors outside the recorded inputs: their
// gradients would be lost without a word, so they do not compile.
template <typename T>
struct CheckpointArgument {
  static constexpr bool kAllowed = !std::is_same_v<T, std::optional<at::Tensor>> &&
                                   !std::is_same_v<T, std::vector<at::Tensor>>;
};

// For each argument, its index among the tensor arguments.
template <typename... Ts>
constexpr std::array<std::size_t, sizeof...(Ts)> checkpoint_tensor_slots() {
  std::array<std::size_t, sizeof...(Ts)> slots{};
  std::size_t next = 0, i = 0;
  ((slots[i++] = std::is_same_v<Ts, at::Tensor> ? next++ : 0), ...);
  (void)next;
  (void)i;
  return slots;
}

template <typename T>
using CheckpointArgRef = std::conditional_t<std::is_same_v<T, at::Tensor>, const at::Tensor&, T&>;

template <std::size_t I, typename Stored>
decltype(auto) checkpoint_argument(Stored& stored, const std::vector<at::Tensor>& tensors,
                                   std::size_t slot) {
  if constexpr (std::is_same_v<std::tuple_element_t<I, Stored>, at::Tensor>) {
    return tensors.at(slot);
  } else {
    (void)tensors;
    (void)slot;
    return std::get<I>(stored);
  }
}

template <typename Fn, typename Stored, std::size_t N, std::size_t... I>
decltype(auto) call_checkpointed(Fn& fn, Stored& stored, const std::vector<at::Tensor>& tensors,
                                 const std::array<std::size_t, N>& slots,
                                 std::index_sequence<I...>) {
  (void)slots;
  return fn(checkpoint_argument<I>(stored, tensors, slots[I])...);
}

template <typename Fn, typename... Args>
auto checkpoint_call(const CheckpointOptions& options, Fn&& fn, Args&&... args) {
  using Stored = std::tuple<std::decay_t<Args>...>;
  using Result = std::decay_t<
      std::invoke_result_t<std::decay_t<Fn>&, CheckpointArgRef<std::decay_t<Args>>...>>;
  static_assert((CheckpointArgument<std::decay_t<Args>>::kAllowed && ...),
                "tandem::checkpoint: pass tensors as at::Tensor arguments (an undefined "
                "at::Tensor stands for none), not as std::optional or std::vector; or call "
                "checkpoint_tensors() with a list");
  if (!c10::GradMode::is_enabled()) {
    return Result(std::forward<Fn>(fn)(std::forward<Args>(args)...));
  }
  Stored stored(std::forward<Args>(args)...);
  std::vector<at::Tensor> tensors;
  // The tensors travel as inputs (saved for backward, freed after it); the
  // copy kept for the recompute holds only the other arguments.
  std::apply(
      [&tensors](auto&... arg) {
        auto take = [&tensors](auto& a) {
          if constexpr (std::is_same_v<std::decay_t<decltype(a)>, at::Tensor>) {
            tensors.push_back(std::move(a));
            a = at::Tensor();
          }
        };
        (take(arg), ...);
      },
      stored);
  constexpr auto slots = checkpoint_tensor_slots<std::decay_t<Args>...>();
  CheckpointFunction erased = [fn = std::decay_t<Fn>(std::forward<Fn>(fn)),
                               stored = std::move(stored),
                               slots](const std::vector<at::Tensor>& inputs) mutable {
    return CheckpointResult<Result>::to_list(
        call_checkpointed(fn, stored, inputs, slots, std::index_sequence_for<Args...>{}));
  };
  return CheckpointResult<Result>::from_list(
      checkpoint_tensors(std::move(erased), std::move(tensors), options));
}

}  // namespace detail

// Runs fn(args...) and returns what it returns (at::Tensor, a vector or a
// tuple of tensors), keeping only the tensor arguments for backward, which
// runs fn(args...) again (see the top of this file). Tensor arguments get
// gradients; other arguments (ints, options, a bool `train`) are copied and
// passed again unchanged. With grad mode off it is just fn(args...).
// Thread-safety: as fn's.
template <typename Fn, typename... Args,
          typename = std::enable_if_t<!std::is_same_v<std::decay_t<Fn>, CheckpointOptions>>>
auto checkpoint(Fn&& fn, Args&&... args) {
  return detail::checkpoint_call(CheckpointOptions{}, std::forward<Fn>(fn),
                                 std::forward<Args>(args)...);
}

// The same with options.
template <typename Fn, typename... Args>
auto checkpoint(const CheckpointOptions& options, Fn&& fn, Args&&... args) {
  return detail::checkpoint_call(options, std::forward<Fn>(fn), std::forward<Args>(args)...);
}

// The non-template part of Checkpointed<Impl>, found by dynamic_cast while
// walking a module tree. Off until switched on: a marked block is the plain
// block until then (one bool test per forward).
class CheckpointedModule {
 public:
  virtual ~CheckpointedModule() = default;
  // Not while a forward or backward of this module runs on another thread.
  void set_checkpointing(bool enabled) { checkpointing_ = enabled; }
  bool checkpointing() const { return checkpointing_; }

 protected:
  bool checkpointing_ = false;
};

// Impl (a torch::nn::Module with a forward()) whose forward runs through
// tandem::checkpoint when checkpointing is on. Arguments and results follow
// checkpoint()'s rules.
template <typename Impl>
class CheckpointedImpl : public Impl, public CheckpointedModule {
 public:
  using Impl::Impl;

  template <typename... Args>
  auto forward(Args&&... args)
      -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
    if (!checkpointing_) return Impl::forward(std::forward<Args>(args)...);
    return tandem::checkpoint(
        [this](auto&&... a) { return this->Impl::forward(std::forward<decltype(a)>(a)...); },
        std::forward<Args>(args)...);
  }
};

template <typename Impl>
using Checkpointed = torch::nn::ModuleHolder<CheckpointedImpl<Impl>>;

// Switches checkpointing on or off for every Checkpointed block in `model`'s
// tree, `model` included. Returns how many there are. Call between steps.
std::size_t set_activation_checkpointing(torch::nn::Module& model, bool enabled);

// The config's activation_checkpointing block applied to `model`: when it is
// enabled, switches every Checkpointed block on (and logs a warning when the
// model marks none, since then nothing is checkpointed); when it is not,
// leaves the blocks as the program set them. Returns the number switched on.
std::size_t apply_activation_checkpointing(torch::nn::Module& model,
                                           const ActivationCheckpointingConfig& config);

}  // namespace tandem
