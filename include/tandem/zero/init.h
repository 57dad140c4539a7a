#pragma once
// tandem::zero::Init: build a ZeRO stage-3 model without any rank holding all
// of it, as DeepSpeed's `deepspeed.zero.Init` does.
//
//   torch::manual_seed(0);                       // the same seed on every rank
//   std::optional<tandem::zero::Init> init;
//   init.emplace(*process_group);                // or: auto init = accelerator.zero_init();
//   Gpt model(config);                           // each Sharded unit cut as it is built
//   init.reset();
//   tandem::ZeroOptimizer zero(model, adamw, process_group, {.stage = 3});
//
// While an Init lives on a thread, every tandem::Sharded unit constructed on
// that thread is cut to this rank's shard the moment its constructor returns:
// its parameters are laid out exactly as ZeroOptimizer lays out a stage-3 unit,
// this rank keeps its 1/N slice, and the rest is freed before the next unit
// is built. A rank therefore holds its shards, the unit being built and a
// placeholder as large as the largest unit (plus the parameters outside
// every unit, which stage 3 keeps whole anyway) instead of the whole model. The unit is built by its own constructor, so its values
// are exactly those the materialised model gets from the same seed; the
// ZeroOptimizer that adopts the shards checks that every rank built the same
// values (a fingerprint per unit) and refuses, naming the unit, otherwise.
//
// Between construction and the ZeroOptimizer a cut unit's parameters hold no
// memory, like stage-3 parameters between uses: calling the unit's forward
// throws, and nothing may read, write, cast or move them (no model->to(...)).
// Build the optimizer over model->parameters() as usual; only the
// ZeroOptimizer (stage 3, over a process group of the Init's size) may adopt
// the model. A unit whose trainable parameters changed after construction (a
// weight frozen or tied across units) is gathered back whole when the
// ZeroOptimizer is built, then sharded as without Init.
//
// On a GPU: make the Init with the training device (Accelerator::zero_init()
// does). Each unit is still built on the host by its constructor, then its
// cut parameters move to that device and are cut there, so the device holds
// only this rank's shards; parameters outside the cut (frozen, small, outside
// every unit) stay where they were built until the model is moved.
//
// Nested units: the inner unit is cut first, the outer one takes what is left.
// Thread-safety: an Init applies to the thread that made it (ranks run as
// threads in tests each make their own); Inits on one thread nest, the
// innermost applies.

#include <cstdint>
#include <memory>

#include <c10/core/Device.h>

namespace tandem {

class ProcessGroup;

namespace zero {

class Init {
 public:
  // Cuts units for rank `rank` of `world_size`. Parameters of fewer than
  // `param_persistence_threshold` elements stay whole: pass the
  // ZeroOptions::param_persistence_threshold the model will be trained with
  // (a unit cut with another threshold is gathered back whole and cut again).
  // Each cut unit's shards live on `device` (the device the model will
  // train on; the CPU by default).
  Init(int world_size, int rank, int64_t param_persistence_threshold = 0,
       c10::Device device = c10::kCPU);
  // The process group's size and rank.
  explicit Init(const ProcessGroup& process_group, int64_t param_persistence_threshold = 0,
                c10::Device device = c10::kCPU);
  // A guard that does nothing (what Accelerator::zero_init() returns when the
  // config does not ask for stage-3 construction).
  static Init disabled();
  ~Init();
  Init(Init&& other) noexcept;
  Init& operator=(Init&&) = delete;
  Init(const Init&) = delete;
  Init& operator=(const Init&) = delete;

  bool enabled() const { return state_ != nullptr; }
  // Units cut under this guard so far.
  int units_cut() const;

  struct State;

 private:
  Init() = default;
  std::unique_ptr<State> state_;
};

}  // namespace zero
}  // namespace tandem
