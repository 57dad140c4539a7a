#pragma once
// DistributedSampler: which dataset indices this rank visits in an epoch.
//
// Index for index the same order as PyTorch's
// torch.utils.data.DistributedSampler, so a job that mixes tandem and Python
// ranks, or that resumes a Python run in C++, sees each sample where PyTorch
// would put it:
//   1. shuffle: torch.randperm(n) from a CPU generator seeded with
//      seed + epoch (uint64 wrap-around, as Python's manual_seed); else 0..n-1.
//   2. drop_last = false: pad to total_size by repeating the list from its
//      start (as many times as needed, so n < num_replicas works);
//      drop_last = true: cut the list to total_size.
//   3. rank r takes positions r, r + num_replicas, r + 2 * num_replicas, ...
// Every rank therefore gets exactly num_samples() indices.
//
// Thread-safety: const methods may run concurrently; set_epoch() must not run
// concurrently with anything else on the same object.

#include <cstdint>
#include <vector>

namespace tandem {

class ProcessGroup;

class DistributedSampler {
 public:
  // Sampler for `rank` of `num_replicas` over a dataset of `dataset_size`
  // samples. `seed` must be the same on every rank, or ranks draw different
  // permutations and samples are duplicated and lost. Throws UsageError when
  // num_replicas < 1, rank is outside [0, num_replicas) or dataset_size < 0.
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  // Same, with num_replicas = pg.world_size() and rank = pg.rank(). A
  // collective: every rank of `pg` must construct its sampler at the same
  // point. It checks that all ranks passed the same dataset_size, shuffle,
  // seed and drop_last, and throws UsageError naming the first rank that
  // differs. The sampler keeps no reference to `pg`.
  DistributedSampler(ProcessGroup& pg, int64_t dataset_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);

  // This rank's indices for the current epoch, num_samples() of them, each in
  // [0, dataset_size). Deterministic in (constructor arguments, epoch(),
  // bucketing).
  std::vector<int64_t> indices() const;

  // Turns on length bucketing (see DistributedLoaderOptions::sample_lengths):
  // before padding and sharding, the epoch's order is cut into pools of
  // `pool_batches` global batches of batch_size * num_replicas() samples,
  // each pool sorted by `lengths` (longest first, ties in order), and the
  // full global batches are shuffled as blocks when shuffle() is on; a short
  // last block stays last. Rank r then takes positions r, r + R, ... as
  // without bucketing, so global batch k (this rank's entries
  // [k * batch_size, (k + 1) * batch_size)) is one block on every rank.
  // No longer PyTorch's order. Throws UsageError when lengths.size() !=
  // dataset_size(), a length is negative, or batch_size or pool_batches < 1.
  // Not a collective; call check_same_on_every_rank() afterwards over a
  // process group.
  void bucket_by_length(std::vector<int64_t> lengths, int64_t batch_size, int64_t pool_batches);
  bool bucketed() const { return bucket_batch_size_ > 0; }

  // A collective over `pg`, whose world and rank must be this sampler's:
  // throws UsageError on every rank, naming the first rank that differs,
  // when ranks disagree on dataset_size, shuffle, seed, drop_last or the
  // bucketing (lengths, batch size, pool). One all-gather.
  void check_same_on_every_rank(ProcessGroup& pg) const;

  // Indices per rank and epoch: ceil(n / replicas), or floor(n / replicas)
  // with drop_last.
  int64_t num_samples() const { return num_samples_; }
  // num_samples() * num_replicas(): the length of the padded or cut list.
  int64_t total_size() const { return num_samples_ * num_replicas_; }

  // Selects the permutation of later indices() calls; with shuffle, call it
  // at the start of every epoch (as in PyTorch), or every epoch repeats the
  // same order. Any value is allowed, negative ones included.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  int64_t dataset_size() const { return dataset_size_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }

 private:
  int64_t dataset_size_;
  int64_t num_replicas_;
  int64_t rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  // Length bucketing, off while bucket_batch_size_ == 0.
  std::vector<int64_t> lengths_;
  int64_t bucket_batch_size_ = 0;
  int64_t bucket_pool_batches_ = 0;
};

// Bucketing's reordering (DistributedSampler::bucket_by_length), exposed for
// tests: `order` (a permutation of [0, lengths.size())) cut into pools of
// pool_batches * block entries, each sorted by length descending (stable),
// then the full blocks of `block` entries shuffled with `shuffle_seed` when
// `shuffle`. Thread-safe.
std::vector<int64_t> bucket_order(const std::vector<int64_t>& order,
                                  const std::vector<int64_t>& lengths, int64_t block,
                                  int64_t pool_batches, bool shuffle, uint64_t shuffle_seed);

// torch.randperm(n, generator=g) after g.manual_seed(seed), on the CPU.
// Exposed so that tests can pin the permutation itself. Thread-safe.
std::vector<int64_t> seeded_randperm(int64_t n, uint64_t seed);

namespace detail {

// HF Accelerate's sharding of one epoch's `order`: rank `rank` of
// `replicas`'s samples, in order, so that cutting them into batches of
// `batch_size` gives its batches. BatchSamplerShard's, or with `dispatched`
// DataLoaderDispatcher's; `split`, `drop_last` and `even_batches` as
// DistributedLoaderOptions' split_batches, drop_last and even_batches.
std::vector<int64_t> accelerate_batch_shard(const std::vector<int64_t>& order,
                                            int64_t batch_size, int64_t replicas, int64_t rank,
                                            bool dispatched, bool split, bool drop_last,
                                            bool even_batches);

}  // namespace detail
}  // namespace tandem
