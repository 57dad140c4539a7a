#pragma once
// StreamingLoader: batches from an iterable (streaming) dataset, one whose
// size is not known ahead, e.g. lines of sharded files or a generator, as
// DataLoader over an IterableDataset.
//
// Sharding: with R ranks and W workers per rank there are S = R * W shards;
// (rank r, worker w) reads shard r * W + w (W counts as 1 without workers).
// The factory is called once per shard and pass, on the thread that reads
// it, and returns that shard's stream. It must give each shard a disjoint
// part of the data whose union is all of it: e.g. files f with
// f % S == shard.index(), or shard_stream() below, which keeps item k of a
// stream every shard reads in full iff k % S == shard.index(). Then, across
// ranks and workers, every sample is yielded exactly once per pass: none
// duplicated, none lost (the last short batch of each shard included,
// unless drop_last).
//
// Order: each worker cuts its shard into batches of batch_size (its last
// one may be short); next() takes one batch from each worker in turn
// (0, 1, ..., W-1, 0, ...), skipping workers whose shard has ended, as
// PyTorch's loader does over an IterableDataset. The sequence depends only
// on the streams, not on the threads' timing.
//
// Uneven ends: shards may hold different numbers of samples, so ranks may
// yield different numbers of batches; a training loop that runs a
// collective per batch would then hang on the rank with more. Built with a
// ProcessGroup and even_batches (the default there), the ranks vote before
// each batch (one all-gather of two integers): while any rank still has
// data, every rank yields a batch; a rank past its data yields its last
// batch again with padding() true (give it zero weight, or skip the
// optimizer step's contribution, as the Accelerator's shadow batches do),
// and all ranks end the pass at the same batch. Real samples are still
// each seen exactly once. Without a group (or with even_batches off) each
// rank yields exactly its own batches.
//
// Resuming mid-pass: skip_first_batches(k) makes the next pass read and drop
// its first k batches (exact, since the sequence is deterministic; the
// skipped batches cost their reading and collating time).
//
// Thread-safety: use a loader from one thread at a time. The factory and its
// streams run on worker threads when num_workers > 0 (each stream on one
// thread only; the factory concurrently for different shards), and the
// collate too.

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include <c10/core/Device.h>

#include "tandem/data/collate.h"
#include "tandem/data/distributed_loader.h"
#include "tandem/data/pull_iterator.h"

namespace tandem {

class ProcessGroup;

// Which part of a stream one reader takes: reader `worker` of
// `num_workers` on rank `rank` of `world_size`.
struct StreamShard {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t worker = 0;
  int64_t num_workers = 1;

  // This shard's number, in [0, count()).
  int64_t index() const { return rank * num_workers + worker; }
  // Shards over all ranks and workers.
  int64_t count() const { return world_size * num_workers; }
  // Whether item k of a stream that every shard reads in full is this one's.
  bool owns(int64_t k) const { return k % count() == index(); }
};

// The next sample of a stream, or nullopt at its end (and from then on).
using SampleStream = std::function<std::optional<Sample>()>;
// Opens `shard`'s stream for pass `epoch` (StreamingLoader::epoch()).
using StreamFactory = std::function<SampleStream(const StreamShard& shard, int64_t epoch)>;

// Keeps item k of `all` iff shard.owns(k): sharding for a stream that cannot
// be split at its source (every shard reads all of it and drops the rest).
SampleStream shard_stream(SampleStream all, const StreamShard& shard);

struct StreamingLoaderOptions {
  // Samples per batch (per shard: each worker batches its own shard).
  int64_t batch_size = 1;
  // Drop each shard's last batch when it holds fewer than batch_size
  // samples: then those samples are not yielded.
  bool drop_last = false;
  // Reader threads per rank, each with its own shard; 0: the stream is read
  // on the consumer's thread inside next(). Must be the same on every rank.
  int64_t num_workers = 0;
  // Finished batches each worker may hold waiting for next(), >= 1.
  int64_t prefetch_factor = 2;
  // With a ProcessGroup: vote so that every rank yields the same number of
  // batches (see above). Ignored without one.
  bool even_batches = true;
  // As DistributedLoaderOptions: where batches go, and pinning (on the
  // worker) for overlapped uploads. pin_memory and non_blocking act only
  // for a CUDA device and are ignored otherwise, as there.
  c10::Device device = c10::Device(c10::kCPU);
  bool pin_memory = false;
  bool non_blocking = false;
};

class StreamingLoader {
 public:
  using Batch = DistributedLoader::Batch;
  using Collate = std::function<Batch(std::vector<Sample> samples)>;

  // The loader of `rank` of `num_replicas`; batches are collate(samples)
  // (stack_collate by default; e.g. PadCollate{} for variable lengths).
  // Throws UsageError for a bad rank or options, or an empty factory.
  StreamingLoader(StreamFactory factory, int64_t num_replicas, int64_t rank,
                  StreamingLoaderOptions options = {}, Collate collate = stack_collate);
  // Same with rank and world from `pg`. A collective: every rank constructs
  // its loader at the same point, and it throws UsageError on every rank
  // when they disagree on num_workers (the shards would overlap). With
  // even_batches, next() votes over `pg`, which must outlive the loader.
  StreamingLoader(StreamFactory factory, ProcessGroup& pg, StreamingLoaderOptions options = {},
                  Collate collate = stack_collate);

  // Joins the workers (each finishes the batch it is reading). Never throws.
  ~StreamingLoader();
  StreamingLoader(StreamingLoader&&) noexcept;
  StreamingLoader& operator=(StreamingLoader&&) noexcept;

  // Selects the epoch passed to the factory for the next pass, and ends a
  // pass in progress.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;
  // The next pass reads and drops its first num_batches batches. Ends a pass
  // in progress. Throws UsageError when negative.
  void skip_first_batches(int64_t num_batches);

  // The next batch of the pass in progress, starting a pass when none is;
  // nullopt ends the pass. A stream, factory or collate exception comes back
  // here as tandem::Error naming the worker, shard and batch, with the
  // original nested (std::rethrow_if_nested); the pass then ends.
  std::optional<Batch> next();
  // Whether the batch next() returned last is a stand-in (even_batches: this
  // rank is past its data, other ranks are not).
  bool padding() const;
  // Batches of the current pass handed out or skipped so far.
  int64_t position() const;

  const StreamingLoaderOptions& options() const;

  // Input iterator over one pass; begin() ends a pass in progress and starts
  // a new one (a pending skip_first_batches() applies).
  using Iterator = PullIterator<StreamingLoader, Batch>;
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
