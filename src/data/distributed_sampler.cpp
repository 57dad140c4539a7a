#include "tandem/data/distributed_sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>

#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

int64_t compute_num_samples(int64_t dataset_size, int64_t num_replicas, bool drop_last) {
  // PyTorch: drop_last and n % R != 0 -> ceil((n - R) / R), which is n / R
  // for every n >= 0; otherwise ceil(n / R). Both reduce to integer division.
  if (drop_last) return dataset_size / num_replicas;
  return (dataset_size + num_replicas - 1) / num_replicas;
}

}  // namespace

std::vector<int64_t> seeded_randperm(int64_t n, uint64_t seed) {
  TANDEM_CHECK_ARG(n >= 0, "seeded_randperm: n must be >= 0, got {}", n);
  // A private generator per call: no shared state, so concurrent calls are
  // safe, and the draw depends on nothing but (n, seed).
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor perm = at::randperm(n, gen, at::kLong);
  const auto* data = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + n);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  TANDEM_CHECK_ARG(num_replicas >= 1,
                   "DistributedSampler: num_replicas must be >= 1, got {}. Pass the world size "
                   "(ProcessGroup::world_size()), or 1 for a single process.",
                   num_replicas);
  TANDEM_CHECK_ARG(rank >= 0 && rank < num_replicas,
                   "DistributedSampler: rank {} is outside [0, {}) for num_replicas={}. Pass "
                   "this process's rank (ProcessGroup::rank()), which must be below the world "
                   "size.",
                   rank, num_replicas, num_replicas);
  TANDEM_CHECK_ARG(dataset_size >= 0,
                   "DistributedSampler: dataset_size must be >= 0, got {}. Pass the number of "
                   "samples in the dataset (dataset.size()).",
                   dataset_size);
  num_samples_ = compute_num_samples(dataset_size, num_replicas, drop_last);
}

DistributedSampler::DistributedSampler(ProcessGroup& pg, int64_t dataset_size, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : DistributedSampler(dataset_size, pg.world_size(), pg.rank(), shuffle, seed, drop_last) {
  check_same_on_every_rank(pg);
}

// Every rank must agree on what defines the global index list; a mismatch
// would not fail anywhere, it would silently duplicate and drop samples.
void DistributedSampler::check_same_on_every_rank(ProcessGroup& pg) const {
  TANDEM_CHECK_ARG(pg.world_size() == num_replicas_ && pg.rank() == rank_,
                   "DistributedSampler::check_same_on_every_rank: the sampler is rank {} of {} "
                   "but the process group is rank {} of {}. Check over the group the sampler "
                   "was built for.",
                   rank_, num_replicas_, pg.rank(), pg.world_size());
  // Bucketing is compared through a hash of (lengths, batch size, pool):
  // equal hashes on all ranks, or the message names the field.
  uint64_t bucket_hash = 0;
  if (bucketed()) {
    bucket_hash = 1469598103934665603ull;
    auto mix = [&bucket_hash](int64_t v) {
      bucket_hash ^= static_cast<uint64_t>(v);
      bucket_hash *= 1099511628211ull;
    };
    mix(bucket_batch_size_);
    mix(bucket_pool_batches_);
    for (int64_t l : lengths_) mix(l);
  }
  auto mine = at::empty({5}, at::kLong);
  auto* p = mine.data_ptr<int64_t>();
  p[0] = dataset_size_;
  p[1] = shuffle_ ? 1 : 0;
  p[2] = static_cast<int64_t>(seed_);  // same bits, compared for equality only
  p[3] = drop_last_ ? 1 : 0;
  p[4] = static_cast<int64_t>(bucket_hash);
  const std::vector<at::Tensor> all = pg.all_gather(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    const auto* q = all[r].data_ptr<int64_t>();
    if (q[0] == p[0] && q[1] == p[1] && q[2] == p[2] && q[3] == p[3] && q[4] == p[4]) continue;
    TANDEM_THROW(UsageError,
                 "DistributedSampler: rank {} was built with (dataset_size={}, shuffle={}, "
                 "seed={}, drop_last={}, length bucketing {:#x}) but rank {} with "
                 "(dataset_size={}, shuffle={}, seed={}, drop_last={}, length bucketing "
                 "{:#x}). Every rank must see the same dataset and pass the same settings "
                 "(sample_lengths and batch_size included), or ranks draw different orders "
                 "and samples are duplicated or skipped. Fix: build the dataset identically "
                 "on every rank and take seed from the config, not from a per-rank random "
                 "source.",
                 pg.rank(), p[0], p[1] != 0, seed_, p[3] != 0, bucket_hash, r, q[0], q[1] != 0,
                 static_cast<uint64_t>(q[2]), q[3] != 0, static_cast<uint64_t>(q[4]));
  }
}

void DistributedSampler::bucket_by_length(std::vector<int64_t> lengths, int64_t batch_size,
                                          int64_t pool_batches) {
  TANDEM_CHECK_ARG(static_cast<int64_t>(lengths.size()) == dataset_size_,
                   "DistributedSampler::bucket_by_length: {} lengths for a dataset of {} "
                   "samples. Give one length per sample (sample_lengths[i] for sample i).",
                   lengths.size(), dataset_size_);
  TANDEM_CHECK_ARG(batch_size >= 1 && pool_batches >= 1,
                   "DistributedSampler::bucket_by_length: batch_size ({}) and pool_batches ({}) "
                   "must be >= 1.",
                   batch_size, pool_batches);
  for (size_t i = 0; i < lengths.size(); ++i) {
    TANDEM_CHECK_ARG(lengths[i] >= 0,
                     "DistributedSampler::bucket_by_length: sample {} has length {}; lengths "
                     "must be >= 0.",
                     i, lengths[i]);
  }
  lengths_ = std::move(lengths);
  bucket_batch_size_ = batch_size;
  bucket_pool_batches_ = pool_batches;
}

std::vector<int64_t> bucket_order(const std::vector<int64_t>& order,
                                  const std::vector<int64_t>& lengths, int64_t block,
                                  int64_t pool_batches, bool shuffle, uint64_t shuffle_seed) {
  std::vector<int64_t> sorted = order;
  const size_t n = sorted.size();
  const auto pool = static_cast<size_t>(block * pool_batches);
  for (size_t begin = 0; begin < n; begin += pool) {
    const auto first = sorted.begin() + static_cast<std::ptrdiff_t>(begin);
    const auto last = sorted.begin() + static_cast<std::ptrdiff_t>(std::min(n, begin + pool));
    std::stable_sort(first, last, [&lengths](int64_t a, int64_t b) {
      return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
    });
  }
  const auto full_blocks = static_cast<int64_t>(n) / block;
  if (!shuffle || full_blocks < 2) return sorted;
  // Blocks move whole, so every global batch keeps its similar lengths; a
  // short last block stays last, or every later block would straddle two
  // global batches.
  const std::vector<int64_t> perm = seeded_randperm(full_blocks, shuffle_seed);
  std::vector<int64_t> result;
  result.reserve(n);
  for (int64_t k : perm) {
    const auto src = sorted.begin() + static_cast<std::ptrdiff_t>(k * block);
    result.insert(result.end(), src, src + static_cast<std::ptrdiff_t>(block));
  }
  result.insert(result.end(), sorted.begin() + static_cast<std::ptrdiff_t>(full_blocks * block),
                sorted.end());
  return result;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> result;
  result.reserve(static_cast<size_t>(num_samples_));
  if (num_samples_ == 0) return result;

  // uint64 arithmetic wraps exactly like Python's manual_seed(seed + epoch),
  // which reinterprets a negative sum as its two's-complement uint64.
  std::vector<int64_t> order;
  const uint64_t epoch_seed = seed_ + static_cast<uint64_t>(epoch_);
  if (shuffle_) order = seeded_randperm(dataset_size_, epoch_seed);
  if (bucketed()) {
    if (!shuffle_) {
      order.resize(static_cast<size_t>(dataset_size_));
      std::iota(order.begin(), order.end(), int64_t{0});
    }
    // The block shuffle draws from its own stream, not the epoch's
    // permutation again (a fixed odd constant keeps seeds distinct).
    order = bucket_order(order, lengths_, bucket_batch_size_ * num_replicas_,
                         bucket_pool_batches_, shuffle_, epoch_seed ^ 0x9E3779B97F4A7C15ull);
  }
  // Global position p of the padded (or cut) list holds order[p % n]: that is
  // PyTorch's "repeat the list until total_size" without materialising it.
  const int64_t total = total_size();
  for (int64_t p = rank_; p < total; p += num_replicas_) {
    const int64_t i = p % dataset_size_;
    result.push_back(order.empty() ? i : order[static_cast<size_t>(i)]);
  }
  return result;
}

}  // namespace tandem
