#pragma once
// The readers behind StreamingLoader: ShardReader cuts one shard's stream
// into collated batches; StreamWorkers runs one ShardReader per thread, each
// with its own bounded queue. Private to the data layer.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/ThreadLocalState.h>

#include "tandem/data/streaming_loader.h"

namespace tandem::detail {

// Reads one shard. Not thread-safe: one thread at a time.
class ShardReader {
 public:
  using Batch = StreamingLoader::Batch;
  // Opens nothing yet: the factory runs on the first read_batch(), on the
  // thread that reads.
  ShardReader(const StreamFactory& factory, const StreamingLoader::Collate& collate,
              const StreamingLoaderOptions& options, StreamShard shard, int64_t epoch);

  // The shard's next batch, or nullopt at its end (and from then on).
  // Throws what the factory, the stream or the collate threw.
  std::optional<Batch> read_batch();
  // Batches returned so far.
  int64_t batches_read() const { return batches_read_; }
  const StreamShard& shard() const { return shard_; }

 private:
  const StreamFactory& factory_;
  const StreamingLoader::Collate& collate_;
  const StreamingLoaderOptions& options_;
  StreamShard shard_;
  int64_t epoch_;
  SampleStream stream_;
  bool opened_ = false;
  bool ended_ = false;
  int64_t batches_read_ = 0;
};

// One thread per shard reader, each keeping up to `capacity` batches ahead.
class StreamWorkers {
 public:
  using Batch = StreamingLoader::Batch;
  // What pop(w) hands back: a batch, the end of worker w's shard (neither
  // batch nor error), or what its reader threw.
  struct Item {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  // Starts one thread per reader. The readers' references (factory,
  // collate, options) must outlive this object.
  StreamWorkers(std::vector<ShardReader> readers, int64_t capacity);
  // Stops the threads and joins them (each finishes the batch it is
  // reading). Never throws.
  ~StreamWorkers();
  StreamWorkers(const StreamWorkers&) = delete;
  StreamWorkers& operator=(const StreamWorkers&) = delete;

  // Worker w's next item, blocking until it has one. After an end or an
  // error item, do not pop that worker again.
  Item pop(size_t w);
  // Batches worker w had read when it stopped or failed, for messages.
  const ShardReader& reader(size_t w) const { return readers_[w]; }

 private:
  void run(size_t w);

  std::vector<ShardReader> readers_;
  int64_t capacity_;
  at::ThreadLocalState caller_state_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::deque<Item>> queues_;
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: started once the rest exists
};

}  // namespace tandem::detail
