#include "zero/flat_group.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace tandem::detail {

void lay_out(FlatGroup& group, const std::vector<int64_t>& member_numels, int world, int rank) {
  group.offsets.clear();
  group.numel = 0;
  for (int64_t n : member_numels) {
    group.offsets.push_back(group.numel);
    group.numel += n;
  }
  group.padded = (group.numel + world - 1) / world * world;
  if (group.padded == 0) group.padded = world;  // every rank owns at least one slot
  group.shard_numel = group.padded / world;
  group.shard_begin = rank * group.shard_numel;
  const int64_t shard_end = group.shard_begin + group.shard_numel;
  group.segments.clear();
  for (std::size_t k = 0; k < group.members.size(); ++k) {
    const int64_t lo = std::max(group.offsets[k], group.shard_begin);
    const int64_t hi = std::min(group.offsets[k] + member_numels[k], shard_end);
    if (lo >= hi) continue;
    group.segments.push_back(
        {group.members[k], lo - group.offsets[k], lo - group.shard_begin, hi - lo});
  }
}

int64_t storage_bytes(const at::Tensor& tensor) {
  if (!tensor.defined()) return 0;
  return static_cast<int64_t>(tensor.storage().nbytes());
}

}  // namespace tandem::detail
