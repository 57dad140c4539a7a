#include "data/stream_readers.h"
#include "data/worker_threads.h"

#include <utility>

namespace tandem::detail {

ShardReader::ShardReader(const StreamFactory& factory, const StreamingLoader::Collate& collate,
                         const StreamingLoaderOptions& options, StreamShard shard, int64_t epoch)
    : factory_(factory), collate_(collate), options_(options), shard_(shard), epoch_(epoch) {}

std::optional<ShardReader::Batch> ShardReader::read_batch() {
  if (ended_) return std::nullopt;
  if (!opened_) {
    opened_ = true;
    ended_ = true;  // stays ended if the factory throws
    stream_ = factory_(shard_, epoch_);
    ended_ = false;
  }
  std::vector<Sample> samples;
  samples.reserve(static_cast<size_t>(options_.batch_size));
  while (static_cast<int64_t>(samples.size()) < options_.batch_size) {
    std::optional<Sample> sample = stream_ ? stream_() : std::nullopt;
    if (!sample) {
      ended_ = true;
      stream_ = nullptr;  // releases the source (files, ...) now
      break;
    }
    samples.push_back(std::move(*sample));
  }
  if (samples.empty()) return std::nullopt;
  if (ended_ && options_.drop_last && static_cast<int64_t>(samples.size()) < options_.batch_size) {
    return std::nullopt;
  }
  Batch batch = collate_(std::move(samples));
  if (options_.pin_memory && options_.device.is_cuda()) {
    for (auto& t : batch) {
      if (t.is_cpu() && !t.is_pinned()) t = t.pin_memory();
    }
  }
  ++batches_read_;
  return batch;
}

StreamWorkers::StreamWorkers(std::vector<ShardReader> readers, int64_t capacity)
    : readers_(std::move(readers)), capacity_(capacity), queues_(readers_.size()) {
  threads_.reserve(readers_.size());
  try {
    for (size_t w = 0; w < readers_.size(); ++w) threads_.emplace_back([this, w] { run(w); });
  } catch (...) {
    stop_and_join(mutex_, stop_, changed_, threads_);
    throw;
  }
}

StreamWorkers::~StreamWorkers() {
  stop_and_join(mutex_, stop_, changed_, threads_);
}

StreamWorkers::Item StreamWorkers::pop(size_t w) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this, w] { return !queues_[w].empty(); });
  Item item = std::move(queues_[w].front());
  queues_[w].pop_front();
  lock.unlock();
  changed_.notify_all();
  return item;
}

void StreamWorkers::run(size_t w) {
  at::ThreadLocalStateGuard state_guard(caller_state_);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this, w] {
        return stop_ || static_cast<int64_t>(queues_[w].size()) < capacity_;
      });
      if (stop_) return;
    }
    Item item;
    try {
      item.batch = readers_[w].read_batch();
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool last = !item.batch;  // the end of the shard, or an error
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queues_[w].push_back(std::move(item));
    }
    changed_.notify_all();
    if (last) return;
  }
}

}  // namespace tandem::detail
