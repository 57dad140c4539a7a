#include "tandem/data/distributed_sampler.h"

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

// Every rank must agree on what defines the global index list; a mismatch
// would not fail anywhere, it would silently duplicate and drop samples.
void check_same_on_every_rank(ProcessGroup& pg, int64_t dataset_size, bool shuffle, uint64_t seed,
                              bool drop_last) {
  auto mine = at::empty({4}, at::kLong);
  auto* p = mine.data_ptr<int64_t>();
  p[0] = dataset_size;
  p[1] = shuffle ? 1 : 0;
  p[2] = static_cast<int64_t>(seed);  // same bits, compared for equality only
  p[3] = drop_last ? 1 : 0;
  const std::vector<at::Tensor> all = pg.all_gather(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    const auto* q = all[r].data_ptr<int64_t>();
    if (q[0] == p[0] && q[1] == p[1] && q[2] == p[2] && q[3] == p[3]) continue;
    TANDEM_THROW(UsageError,
                 "DistributedSampler: rank {} was built with (dataset_size={}, shuffle={}, "
                 "seed={}, drop_last={}) but rank {} with (dataset_size={}, shuffle={}, "
                 "seed={}, drop_last={}). Every rank must see the same dataset and pass the "
                 "same settings, or ranks draw different orders and samples are duplicated "
                 "or skipped. Fix: build the dataset identically on every rank and take "
                 "seed from the config, not from a per-rank random source.",
                 pg.rank(), p[0], p[1] != 0, seed, p[3] != 0, r, q[0], q[1] != 0,
                 static_cast<uint64_t>(q[2]), q[3] != 0);
  }
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
  check_same_on_every_rank(pg, dataset_size, shuffle, seed, drop_last);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> result;
  result.reserve(static_cast<size_t>(num_samples_));
  if (num_samples_ == 0) return result;

  // uint64 arithmetic wraps exactly like Python's manual_seed(seed + epoch),
  // which reinterprets a negative sum as its two's-complement uint64.
  std::vector<int64_t> order;
  if (shuffle_) {
    order = seeded_randperm(dataset_size_, seed_ + static_cast<uint64_t>(epoch_));
  }
  // Global position p of the padded (or cut) list holds order[p % n]: that is
  // PyTorch's "repeat the list until total_size" without materialising it.
  const int64_t total = total_size();
  for (int64_t p = rank_; p < total; p += num_replicas_) {
    const int64_t i = p % dataset_size_;
    result.push_back(shuffle_ ? order[static_cast<size_t>(i)] : i);
  }
  return result;
}

}  // namespace tandem
