#pragma once
// The flat layout behind ZeRO: a group of parameters (a gradient bucket in
// stages 1 and 2, a Sharded unit in stage 3) laid end to end in one buffer,
// padded to a multiple of the world size, rank r owning slice r. What
// changes during a step (a unit's gather state, a packed gradient in
// flight) is kept by the part of the engine that changes it, not here.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem {
class ShardedUnit;
}

namespace tandem::detail {

struct UnitShard;

// A stretch of this rank's shard that lies in one parameter.
struct ShardSegment {
  std::size_t param = 0;       // index into the engine's parameter list
  int64_t param_offset = 0;    // first element within the parameter
  int64_t shard_offset = 0;    // first element within the shard
  int64_t length = 0;
};

// A run of the shard updated with one set of hyperparameters: consecutive
// segments whose parameters share an optimizer param group.
struct ShardRun {
  std::size_t param_group = 0;
  int64_t shard_offset = 0;
  int64_t length = 0;
};

struct FlatGroup {
  std::vector<std::size_t> members;  // parameter indices, in layout order
  std::vector<int64_t> offsets;      // each member's first element in the flat buffer
  int64_t numel = 0;                 // sum of the members' elements
  int64_t padded = 0;                // numel rounded up to a multiple of the world size
  int64_t shard_numel = 0;           // padded / world size
  int64_t shard_begin = 0;           // this rank's first element in the flat buffer

  ShardedUnit* unit = nullptr;       // stage 3: the unit whose parameters these are
  bool partitioned_params = false;   // stage 3 unit: whole only while in use
  // Stage 3: the unit's shard cut by zero::Init at construction, in this
  // group's layout, to adopt instead of laying the parameters out again.
  std::shared_ptr<UnitShard> construction;

  at::Tensor full;         // padded flat parameters (the params' dtype and device)
  at::Tensor param_shard;  // partitioned_params: this rank's slice, kept between uses
  at::Tensor master;       // fp32 shard the optimizer updates
  bool master_is_param = false;  // master aliases the parameters' own memory
  at::Tensor grad_full;    // stage 1: padded flat gradients; .grad aliases them
  at::Tensor grad_shard;   // fp32 gradient shard the update reads
  bool grad_shard_is_view = false;  // stage 1: aliases grad_full's slice
  std::vector<at::Tensor> state;    // optimizer state shards (moments, momentum)
  std::vector<ShardSegment> segments;
  std::vector<ShardRun> runs;
};

// Lays out `members` (with their element counts) for `world` ranks and
// computes `rank`'s segments.
void lay_out(FlatGroup& group, const std::vector<int64_t>& member_numels, int world, int rank);

// Bytes `tensor`'s storage holds now (0 while internals::release_storage()
// has freed it).
int64_t storage_bytes(const at::Tensor& tensor);

}  // namespace tandem::detail
