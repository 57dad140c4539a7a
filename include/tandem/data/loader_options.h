#pragma once
// Options of tandem::DistributedLoader: one struct, as gloo and c10d have per
// operation. The defaults reproduce PyTorch's
//   DataLoader(dataset, batch_size=1,
//              sampler=DistributedSampler(dataset, shuffle=True, seed=0))
// on every rank.

#include <cstdint>
#include <vector>

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
  // into page-locked memory first (on the worker thread that assembled it,
  // when there are workers), which non_blocking needs for the copy to
  // overlap with compute. The upload itself runs on the consumer's thread,
  // on its current stream.
  bool pin_memory = false;
  bool non_blocking = false;

  // Worker threads that assemble batches ahead of the consumer, as
  // DataLoader's num_workers (threads here, not processes: the fetch, and so
  // a dataset's get(), must be safe to call from several threads at once).
  // 0: batches are assembled on the consumer's thread inside next() (or on
  // one background thread with `prefetch`, below). Workers assemble batches
  // out of order, but the loader yields them strictly in order: the batches
  // are the same for every num_workers, so a resumed run stays exact.
  int64_t num_workers = 0;
  // With num_workers > 0: at most num_workers * prefetch_factor batches are
  // in flight (being assembled, or finished and waiting for next()), as
  // DataLoader's prefetch_factor. Must be >= 1.
  int64_t prefetch_factor = 2;

  // The one-thread form kept from before num_workers: `prefetch` = k > 0
  // assembles batches on one background thread with up to k finished
  // batches waiting (k + 1 in flight). Use either this or num_workers, not
  // both. 0: off.
  int64_t prefetch = 0;

  // Length bucketing (off when empty): sample_lengths[i] is sample i's
  // length (e.g. its token count), one entry per dataset sample, >= 0.
  // Each epoch's order (shuffled or not) is cut into pools of
  // bucket_pool_batches global batches (batch_size * world_size samples);
  // each pool is sorted by length, longest first, and cut into global
  // batches, whose order is then shuffled (when shuffle is on). So every
  // step's batches, on every rank, hold samples of similar length: less
  // padding with pad_collate. Deterministic in (seed, epoch, lengths), the
  // same on every rank, and each rank still gets a disjoint share of the
  // same size; padding and drop_last work as without bucketing (padding
  // repeats the start of the bucketed order, so the last global batch may
  // mix lengths). Must be the same on every rank.
  std::vector<int64_t> sample_lengths;
  int64_t bucket_pool_batches = 50;

  // How the epoch's order (shuffled or not, as above) is dealt to the ranks.
  // kSamples: DistributedSampler's (sample r, r + R, ...; padding and
  // sampler_drop_last as above). The other two are HF Accelerate's, index
  // for index, for prepared loaders with split_batches or dispatch_batches
  // (neither takes sample_lengths or sampler_drop_last):
  // - kBatches, BatchSamplerShard's: the order is cut into batches of
  //   batch_size and batch k goes to rank k % R. even_batches: a last round
  //   that is not full is completed from the epoch's first samples, so every
  //   rank yields the same number of full batches; otherwise ranks yield
  //   what the cut gives them. drop_last: a short last batch is dropped, and
  //   so is a round that is not full. With split_batches the order is cut
  //   into global batches of batch_size * R instead, and rank r takes slice
  //   [r * batch_size, (r + 1) * batch_size) of each; a short last one is
  //   dropped (drop_last), completed from the epoch's first samples
  //   (even_batches), or sliced as it is.
  // - kDispatched, DataLoaderDispatcher's: R batches of batch_size (with
  //   split_batches, one global batch) are joined and rank r takes the r-th
  //   of R equal slices. A short last join is dropped with drop_last; else
  //   each rank takes len / R of it, one more when R does not divide len,
  //   the join then completed with the epoch's first R samples.
  enum class Sharding { kSamples, kBatches, kDispatched };
  Sharding sharding = Sharding::kSamples;
  bool split_batches = false;
};

// Throws UsageError naming the first bad field and how to fix it.
void validate(const DistributedLoaderOptions& options);

}  // namespace tandem
