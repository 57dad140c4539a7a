#include "zero/bucketed_gather.h"

#include <algorithm>

#include <ATen/ATen.h>

namespace tandem::detail {

int64_t bucketed_all_gather(ProcessGroup& pg, at::Tensor& full, const at::Tensor& shard,
                            int64_t bucket) {
  const int64_t world = pg.world_size();
  const int64_t shard_numel = shard.numel();
  // Each call gathers the same stretch [begin, begin + chunk) of every
  // rank's shard: chunk * world elements in all.
  const int64_t chunk = std::max<int64_t>(1, bucket / world);
  if (chunk >= shard_numel) {
    pg.all_gather_into(full, shard);
    return 1;
  }
  at::Tensor by_rank = full.view({world, shard_numel});
  at::Tensor staging = at::empty({world * chunk}, full.options());
  int64_t calls = 0;
  for (int64_t begin = 0; begin < shard_numel; begin += chunk) {
    const int64_t length = std::min(chunk, shard_numel - begin);
    at::Tensor out = staging.narrow(0, 0, world * length);
    pg.all_gather_into(out, shard.narrow(0, begin, length));
    by_rank.narrow(1, begin, length).copy_(out.view({world, length}));
    ++calls;
  }
  return calls;
}

}  // namespace tandem::detail
