#pragma once
// Options of tandem::DistributedLoader: one struct, as gloo and c10d have per
// operation. The defaults reproduce PyTorch's
//   DataLoader(dataset, batch_size=1,
//              sampler=DistributedSampler(dataset, shuffle=True, seed=0))
// on every rank.

#include <cstdint>

#include <c10/core/Device.h>

namespace tandem {

struct DistributedLoaderOptions {
  // Samples per batch on this process (not across the world); the global
  // batch is batch_size * world_size. Must be >= 1.
  int64_t batch_size = 1;

  // Draw a new permutation per epoch from seed + epoch (DistributedSampler's
  // shuffle and seed). seed must be the same on every rank.
  bool shuffle = true;
  uint64_t seed = 0;

  // Drop this rank's last batch when it holds fewer than batch_size samples
  // (DataLoader's drop_last).
  bool drop_last = false;

  // How the dataset is split when world_size does not divide its size:
  // - sampler_drop_last = false, even_batches = true (the default):
  //   PyTorch's DistributedSampler padding. The index list wraps around to
  //   the start of the epoch's order until every rank has the same number of
  //   samples, so every rank yields the same number of batches and collectives
  //   stay matched; up to world_size - 1 samples are seen twice per epoch.
  // - sampler_drop_last = false, even_batches = false: no padding. Each
  //   sample is seen exactly once (what evaluation wants), but ranks may hold
  //   one sample less and so yield one batch less than others; a training
  //   loop must then not issue a collective for the missing step. Each rank's
  //   batches are a prefix of what it gets with even_batches = true.
  // - sampler_drop_last = true: DistributedSampler(drop_last=True). The tail
  //   is cut so every rank has n / world_size samples; counts are already
  //   equal and even_batches has no effect.
  bool even_batches = true;
  bool sampler_drop_last = false;

  // Where batches are delivered. Batches are assembled on the CPU (or where
  // the dataset's tensors live) and moved with Tensor::to(device).
  c10::Device device = c10::Device(c10::kCPU);
  // Only for CUDA devices; ignored otherwise. pin_memory copies each batch
  // into page-locked memory first (on the prefetch thread when prefetch > 0),
  // which non_blocking needs for the copy to overlap with compute.
  bool pin_memory = false;
  bool non_blocking = false;

  // Batches prepared ahead of the consumer on one background thread.
  // 0: batches are fetched synchronously inside next().
  int64_t prefetch = 0;
};

// Throws UsageError naming the first bad field and how to fix it.
void validate(const DistributedLoaderOptions& options);

}  // namespace tandem
