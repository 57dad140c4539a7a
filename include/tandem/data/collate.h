#pragma once
// Per-sample loading with a user collate, as DataLoader's collate_fn:
//
//   auto fetch = tandem::collate_fetch(
//       [&](int64_t i) { return tandem::Sample{tokens[i], labels[i]}; },
//       tandem::PadCollate{});                   // or any Samples -> Batch
//   tandem::DistributedLoader loader(fetch, tokens.size(), *pg, options);
//
// PadCollate pads variable-length fields to the batch's longest and adds a
// mask, which pairs well with length bucketing
// (DistributedLoaderOptions::sample_lengths).

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/data/distributed_loader.h"

namespace tandem {

// One sample as tensors, one per field (e.g. {token_ids, label}).
using Sample = std::vector<at::Tensor>;

// A Fetch that calls get(i) for each index of the batch, in order, and hands
// the samples to collate(samples) -> DistributedLoader::Batch. `Get` is any
// callable int64_t -> S (S of any type: a Sample, a string, a struct) and
// `Collate` any callable std::vector<S> -> Batch. Both are copied into the
// fetch, which runs on the loader's worker threads when there are some: they
// must then be safe to call concurrently.
template <typename Get, typename Collate>
DistributedLoader::Fetch collate_fetch(Get get, Collate collate) {
  using S = std::decay_t<std::invoke_result_t<Get&, int64_t>>;
  using Result = std::invoke_result_t<Collate&, std::vector<S>>;
  static_assert(std::is_convertible_v<Result, DistributedLoader::Batch>,
                "collate_fetch: collate(std::vector<Sample>) must return a "
                "DistributedLoader::Batch");
  return [get = std::move(get), collate = std::move(collate)](const std::vector<int64_t>& indices) {
    std::vector<S> samples;
    samples.reserve(indices.size());
    for (int64_t i : indices) samples.push_back(get(i));
    return DistributedLoader::Batch(collate(std::move(samples)));
  };
}

// Stacks field f of every sample into batch field f (default_collate for
// tensors). Throws UsageError when samples have different field counts or a
// field's shapes differ (use PadCollate for variable lengths).
DistributedLoader::Batch stack_collate(const std::vector<Sample>& samples);

// Pads variable-length fields to the batch's longest and builds a mask.
// For each field, samples' tensors must agree on every dim but dim 0: a
// field with dim >= 1 is padded at the end of dim 0 with padding_value to
// the longest in the batch, giving [batch, longest, ...]; a 0-dim field is
// stacked into [batch]. After the fields comes, when `mask` is set, a bool
// [batch, longest] mask of field `mask_field` (true on real positions), and,
// when `lengths` is set, an int64 [batch] of its lengths. The result is
// therefore {fields..., mask?, lengths?}. Thread-safe (const).
struct PadCollate {
  double padding_value = 0;
  bool mask = true;
  bool lengths = false;
  size_t mask_field = 0;  // must be a field with dim >= 1

  // Throws UsageError for no samples, differing field counts, a field with
  // dim 0 in one sample and not another, differing trailing dims or dtypes,
  // or a mask_field that is out of range or 0-dim.
  DistributedLoader::Batch operator()(const std::vector<Sample>& samples) const;
};

}  // namespace tandem
