#pragma once
// The all-gather that makes a flat group whole, split as DeepSpeed's
// allgather_bucket_size says: calls of at most `bucket` elements in all.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"

namespace tandem::detail {

// Fills `full` (world * shard.numel() elements, rank r's slice at
// r * shard.numel()) with every rank's `shard`, in calls that move at most
// max(bucket, world) elements each. Returns the number of calls. Collective:
// every rank passes the same sizes and bucket. `shard` must not alias
// `full` when more than one call is needed (pass a copy).
int64_t bucketed_all_gather(ProcessGroup& pg, at::Tensor& full, const at::Tensor& shard,
                            int64_t bucket);

}  // namespace tandem::detail
