#pragma once
// What a zero::Init guard leaves in a Sharded unit it cut at construction,
// for the stage-3 ZeroOptimizer to adopt (zero_adopt.cpp).

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/zero/sharded.h"

namespace tandem::detail {

// Bytes of a sentinel value that the parameters of units cut by zero::Init
// point into until a ZeroOptimizer adopts them: code that writes them in the
// meantime (a custom initialisation looping over named_parameters() after
// the constructors) writes here instead of into freed memory, and the
// adoption sees it and refuses. holds_memory() reports these parameters as
// holding none.
struct Placeholder {
  static constexpr uint8_t kSentinel = 0xA5;
  explicit Placeholder(int64_t bytes, c10::Device device);
  ~Placeholder();
  Placeholder(const Placeholder&) = delete;
  Placeholder& operator=(const Placeholder&) = delete;
  // Whether anything changed the first `nbytes` bytes.
  bool written(int64_t nbytes) const;
  at::Tensor bytes;  // kByte
};

struct UnitShard {
  int world = 1;
  int rank = 0;
  // The unit's trainable parameters in layout order (ZeroOptimizer's order
  // for a stage-3 unit); each is a view of `full`.
  std::vector<at::Tensor> members;
  at::Tensor full;   // the padded flat parameters; storage released
  // Each member's view of `full`, made while it had memory (a view made of
  // a released storage would make set_() allocate it again).
  std::vector<at::Tensor> views;
  // Until adoption the members are views of this instead of `full`.
  std::shared_ptr<Placeholder> placeholder;
  at::Tensor shard;  // this rank's slice of `full`, kept
  int64_t shard_begin = 0;
  // A hash of `full`'s values when the unit was built, which every rank
  // must share (the same seed built the same unit).
  int64_t fingerprint = 0;
};

// A 64-bit hash of `tensor`'s bytes (any device, made contiguous on the host).
int64_t fingerprint_of(const at::Tensor& tensor);

// Cuts `unit` (whose module is `module`) to this rank's shard when a
// zero::Init guard is active on this thread; does nothing otherwise
// (src/zero/zero_init.cpp).
void cut_at_construction(ShardedUnit& unit, torch::nn::Module& module);

}  // namespace tandem::detail
