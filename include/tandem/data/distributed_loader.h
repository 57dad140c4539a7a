#pragma once
// DistributedLoader: batches of this rank's share of a dataset, per epoch.
//
// Rank r's batch i is exactly what PyTorch gives rank r at step i from
//   DataLoader(dataset, batch_size=b, drop_last=...,
//              sampler=DistributedSampler(dataset, R, r, shuffle, seed, ...))
// after sampler.set_epoch(epoch): the sampler's indices, cut into chunks of
// b in order. Over tensors, a batch is {t[chunk] for t in tensors} (what
// TensorDataset plus default_collate give); over a torch::data dataset it is
// {stack(data), stack(target)} (see make_distributed_loader below).
//
// Iteration runs in passes over the current epoch:
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (auto& batch : loader) step(batch[0], batch[1]);
//   }
// or, one batch at a time, `while (auto batch = loader.next()) ...`.
// Resuming mid-epoch: set_epoch(e); skip_first_batches(i); then iterate.
//
// Workers (DistributedLoaderOptions::num_workers = W > 0): W threads
// assemble batches ahead of the consumer, at most W * prefetch_factor in
// flight, and next() yields them strictly in order, so the batches are the
// same for every W (and resuming with skip_first_batches() stays exact).
// The fetch then runs concurrently with itself on different batches: it
// must be thread-safe, and any randomness in it should come from the
// sample index (a torch::Generator seeded per index), not from a shared
// generator, or the values depend on the threads' timing. The fetch is not
// told the epoch: for augmentations that change every epoch (torch's
// workers reseed per epoch), seed from the index and the epoch the loop
// passed to set_epoch() (a generator seeded by a hash of both).
//
// Thread-safety: use a loader from one thread at a time. With workers (or
// prefetch > 0) the loader runs the fetch (and so the dataset's get()) on
// its own threads; they are joined whenever a pass ends (set_epoch(),
// skip_first_batches(), a new begin(), an error, the destructor).

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include "tandem/core/error.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/data/loader_options.h"

namespace tandem {

class ProcessGroup;

class DistributedLoader {
 public:
  // One tensor per field (e.g. {inputs, labels}), each with batch rows in dim 0.
  using Batch = std::vector<at::Tensor>;
  // Assembles the samples at dataset positions `indices` (in that order, never
  // empty) into one batch. Called from the worker threads when there are
  // some, concurrently for different batches. collate_fetch()
  // (tandem/data/collate.h) builds one from a per-sample get and a collate.
  using Fetch = std::function<Batch(const std::vector<int64_t>& indices)>;

  // Over `tensors` that share dim 0 (sample i is row i of each), like
  // TensorDataset. The loader holds the tensors themselves (shared storage,
  // no copy of the data).
  // Throws UsageError for no tensors, an undefined or 0-dim tensor, differing
  // sizes of dim 0, or bad options.
  DistributedLoader(std::vector<at::Tensor> tensors, int64_t num_replicas, int64_t rank,
                    DistributedLoaderOptions options = {});
  // Same with num_replicas and rank from `pg`. A collective, like
  // DistributedSampler's: every rank must construct its loader at the same
  // point, and it throws UsageError when ranks disagree on the dataset size
  // or the sampling options. The loader keeps no reference to `pg`.
  DistributedLoader(std::vector<at::Tensor> tensors, ProcessGroup& pg,
                    DistributedLoaderOptions options = {});

  // Over any dataset of `dataset_size` samples that `fetch` can assemble.
  DistributedLoader(Fetch fetch, int64_t dataset_size, int64_t num_replicas, int64_t rank,
                    DistributedLoaderOptions options = {});
  DistributedLoader(Fetch fetch, int64_t dataset_size, ProcessGroup& pg,
                    DistributedLoaderOptions options = {});

  // Stops and joins the worker threads, if any: they finish the batches
  // they are assembling (a fetch cannot be interrupted), drop the rest.
  // Never throws.
  ~DistributedLoader();
  DistributedLoader(DistributedLoader&&) noexcept;
  DistributedLoader& operator=(DistributedLoader&&) noexcept;

  // Batches per epoch on this rank, whatever skip_first_batches() says.
  // Equal on every rank unless even_batches = false (see the options).
  int64_t size() const;
  // Samples per epoch on this rank, drop_last not applied.
  int64_t num_samples() const;

  // Selects the epoch (and so, with shuffle, the order) of the next pass, and
  // ends a pass in progress: the next batch is the epoch's first one (or the
  // one skip_first_batches() names). As in PyTorch, an epoch never advances
  // by itself; without set_epoch every pass repeats epoch 0's order.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // Makes the next pass start at batch `num_batches` instead of 0, for
  // resuming mid-epoch; later passes start at 0 again. Ends a pass in
  // progress. May be called before or after set_epoch(). num_batches >=
  // size() gives an empty pass. Throws UsageError when num_batches is
  // negative.
  void skip_first_batches(int64_t num_batches);

  // Switches even-batch padding (DistributedLoaderOptions::even_batches) for
  // the passes that start from now on, e.g. off for a Join-style pass in
  // which ranks keep exactly their share. Ends a pass in progress; a pending
  // skip_first_batches() still applies. size() follows the new setting.
  void set_even_batches(bool even_batches);

  // The next batch of the pass in progress, starting a pass when none is; an
  // empty optional ends the pass, and the call after it starts the next one.
  // When the fetch threw for this batch (on a worker or here), throws
  // tandem::Error naming the batch, the epoch, the thread and the samples,
  // with the fetch's exception nested (std::rethrow_if_nested); the pass
  // then ends, and later batches are not yielded.
  std::optional<Batch> next();

  // This rank's sample indices for the current epoch in batch order, before
  // batching, skipping and drop_last. Batch i holds entries
  // [i * batch_size, (i + 1) * batch_size) of it.
  std::vector<int64_t> epoch_indices() const;

  const DistributedLoaderOptions& options() const;
  const DistributedSampler& sampler() const;

  // Input iterator over one pass. begin() ends any pass in progress and
  // starts a new one; calling set_epoch() or skip_first_batches() while
  // iterating makes the next ++ throw UsageError instead of mixing passes.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;
    Batch& operator*() { return *batch_; }
    Batch* operator->() { return &*batch_; }
    Iterator& operator++();
    // Iterators compare equal when both are at the end of their pass.
    bool operator==(const Iterator& other) const { return !batch_ && !other.batch_; }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    friend class DistributedLoader;
    Iterator(DistributedLoader* loader, uint64_t pass);
    DistributedLoader* loader_ = nullptr;
    uint64_t pass_ = 0;
    std::optional<Batch> batch_;
  };
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {

// Stacks the per-sample tensors of a torch::data Example into a batch:
// {data} for Example<T, NoTarget>, else {data, target}.
template <typename Data, typename Target>
DistributedLoader::Batch stack_examples(const std::vector<torch::data::Example<Data, Target>>& ex) {
  static_assert(std::is_same_v<Data, at::Tensor>,
                "make_distributed_loader: Example::data must be a tensor");
  std::vector<at::Tensor> data;
  data.reserve(ex.size());
  for (const auto& e : ex) data.push_back(e.data);
  if constexpr (std::is_same_v<Target, torch::data::example::NoTarget>) {
    return {at::stack(data)};
  } else {
    static_assert(std::is_same_v<Target, at::Tensor>,
                  "make_distributed_loader: Example::target must be a tensor or NoTarget");
    std::vector<at::Tensor> target;
    target.reserve(ex.size());
    for (const auto& e : ex) target.push_back(e.target);
    return {at::stack(data), at::stack(target)};
  }
}

template <typename Dataset>
std::pair<DistributedLoader::Fetch, int64_t> dataset_fetch(Dataset dataset) {
  const auto size = dataset.size();
  TANDEM_CHECK_ARG(size.has_value(),
                   "make_distributed_loader: the dataset's size() is empty (an unsized, "
                   "streaming dataset). A distributed sampler must know the size to split "
                   "it; give the dataset a size().");
  auto shared = std::make_shared<Dataset>(std::move(dataset));
  DistributedLoader::Fetch fetch = [shared](const std::vector<int64_t>& indices) {
    using ExampleType = decltype(shared->get(size_t{0}));
    std::vector<ExampleType> examples;
    examples.reserve(indices.size());
    for (int64_t i : indices) examples.push_back(shared->get(static_cast<size_t>(i)));
    return stack_examples(examples);
  };
  return {std::move(fetch), static_cast<int64_t>(*size)};
}

}  // namespace detail

// A loader over a torch::data dataset: anything with size() returning
// optional<size_t> and get(size_t) returning torch::data::Example<> or
// Example<Tensor, NoTarget> (e.g. a torch::data::datasets::Dataset subclass
// or torch::data::datasets::MNIST). The dataset is moved into the loader.
// Each batch is {stack(data)[, stack(target)]}, as default_collate stacks.
// get() runs on the worker threads when there are some (concurrently: it
// must be thread-safe, as for LibTorch's own loader with workers).
template <typename Dataset>
DistributedLoader make_distributed_loader(Dataset dataset, int64_t num_replicas, int64_t rank,
                                          DistributedLoaderOptions options = {}) {
  auto [fetch, size] = detail::dataset_fetch(std::move(dataset));
  return DistributedLoader(std::move(fetch), size, num_replicas, rank, std::move(options));
}

// Same with num_replicas and rank from `pg`; a collective (see above).
template <typename Dataset>
DistributedLoader make_distributed_loader(Dataset dataset, ProcessGroup& pg,
                                          DistributedLoaderOptions options = {}) {
  auto [fetch, size] = detail::dataset_fetch(std::move(dataset));
  return DistributedLoader(std::move(fetch), size, pg, std::move(options));
}

}  // namespace tandem
