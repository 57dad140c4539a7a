#include "tandem/data/streaming_loader.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include <ATen/Context.h>
#include <ATen/Functions.h>

#include "data/stream_readers.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "data/worker_threads.h"

namespace tandem {
namespace {

void validate_stream_options(const StreamingLoaderOptions& options, int64_t num_replicas,
                             int64_t rank) {
  TANDEM_CHECK_ARG(num_replicas >= 1 && rank >= 0 && rank < num_replicas,
                   "StreamingLoader: rank {} of num_replicas {} is not a rank. Pass the world "
                   "size (>= 1) and this process's rank below it.",
                   rank, num_replicas);
  TANDEM_CHECK_ARG(options.batch_size >= 1,
                   "StreamingLoaderOptions: batch_size must be >= 1, got {}.", options.batch_size);
  TANDEM_CHECK_ARG(options.num_workers >= 0,
                   "StreamingLoaderOptions: num_workers must be >= 0, got {}. Use 0 to read on "
                   "the calling thread.",
                   options.num_workers);
  TANDEM_CHECK_ARG(options.prefetch_factor >= 1,
                   "StreamingLoaderOptions: prefetch_factor must be >= 1, got {}.",
                   options.prefetch_factor);
  TANDEM_CHECK_ARG(!options.device.is_cuda() || at::hasCUDA(),
                   "StreamingLoaderOptions: device is {} but this LibTorch has no usable CUDA. "
                   "Use the CPU device, or build against a CUDA LibTorch.",
                   options.device.str());
}

}  // namespace

SampleStream shard_stream(SampleStream all, const StreamShard& shard) {
  TANDEM_CHECK_ARG(shard.count() >= 1 && shard.index() >= 0 && shard.index() < shard.count(),
                   "shard_stream: shard {} of {} is not a shard (rank {} of {}, worker {} of "
                   "{}).",
                   shard.index(), shard.count(), shard.rank, shard.world_size, shard.worker,
                   shard.num_workers);
  return [all = std::move(all), shard, k = int64_t{0}]() mutable -> std::optional<Sample> {
    for (;;) {
      std::optional<Sample> item = all();
      if (!item) return std::nullopt;
      if (shard.owns(k++)) return item;
    }
  };
}

struct StreamingLoader::Impl {
  StreamFactory factory_;
  Collate collate_;
  StreamingLoaderOptions options_;
  int64_t num_replicas_ = 1;
  int64_t rank_ = 0;
  ProcessGroup* vote_group_ = nullptr;  // set with even_batches over a group
  int64_t epoch_ = 0;
  int64_t pending_skip_ = 0;

  // The pass in progress.
  bool active_ = false;
  int64_t position_ = 0;
  std::vector<size_t> turns_;  // workers whose shard has not ended, in turn order
  size_t turn_ = 0;
  std::optional<detail::ShardReader> reader_;  // without workers
  std::unique_ptr<detail::StreamWorkers> workers_;
  std::optional<Batch> last_real_;  // the stand-in once this rank is past its data
  bool padding_ = false;

  int64_t readers() const { return std::max<int64_t>(options_.num_workers, 1); }

  detail::ShardReader make_reader(int64_t worker) {
    return detail::ShardReader(factory_, collate_, options_,
                               StreamShard{rank_, num_replicas_, worker, readers()}, epoch_);
  }

  void start_pass() {
    end_pass();
    active_ = true;
    position_ = 0;
    padding_ = false;
    last_real_.reset();
    turns_.clear();
    turn_ = 0;
    for (int64_t w = 0; w < readers(); ++w) turns_.push_back(static_cast<size_t>(w));
    if (options_.num_workers == 0) {
      reader_.emplace(make_reader(0));
    } else {
      std::vector<detail::ShardReader> readers;
      for (int64_t w = 0; w < options_.num_workers; ++w) readers.push_back(make_reader(w));
      workers_ = std::make_unique<detail::StreamWorkers>(std::move(readers),
                                                         options_.prefetch_factor);
    }
    const int64_t skip = pending_skip_;
    pending_skip_ = 0;
    for (int64_t i = 0; i < skip; ++i) {
      std::optional<Batch> batch = next_real();
      if (!batch) break;
      // Voting ranks keep a stand-in, in case the pass resumes past their data.
      if (vote_group_) last_real_ = std::move(batch);
    }
    // Voting ranks count positions of the common pass, padding included.
    if (vote_group_) position_ = skip;
  }

  void end_pass() {
    workers_.reset();  // joins the threads before the factory may change
    reader_.reset();
    active_ = false;
  }

  // `shard` by value: ending the pass destroys the reader it came from.
  [[noreturn]] void rethrow_stream_error(std::exception_ptr error, StreamShard shard,
                                         int64_t shard_batch) {
    end_pass();
    const std::string what = detail::exception_message(error);
    const std::string where = options_.num_workers > 0
                                  ? fmt::format("worker {}", shard.worker)
                                  : std::string("the calling thread");
    const std::string message = fmt::format(
        "StreamingLoader: reading failed on {} (shard {} of {}) at its batch {}, batch {} of "
        "the pass, epoch {}: {}. The pass has ended; the next next() starts a new one. The "
        "original exception is nested (std::rethrow_if_nested).",
        where, shard.index(), shard.count(), shard_batch, position_, epoch_, what);
    try {
      std::rethrow_exception(error);
    } catch (...) {
      std::throw_with_nested(Error(detail::decorate_error(message, __FILE__, __LINE__)));
    }
  }

  // This rank's next real batch in turn order, or nullopt when every shard
  // has ended. Counts it in position_.
  std::optional<Batch> next_real() {
    while (!turns_.empty()) {
      const size_t w = turns_[turn_];
      std::optional<Batch> batch;
      if (workers_) {
        detail::StreamWorkers::Item item = workers_->pop(w);
        if (item.error) {
          const auto& r = workers_->reader(w);
          rethrow_stream_error(item.error, r.shard(), r.batches_read());
        }
        batch = std::move(item.batch);
      } else {
        try {
          batch = reader_->read_batch();
        } catch (...) {
          rethrow_stream_error(std::current_exception(), reader_->shard(),
                               reader_->batches_read());
        }
      }
      if (!batch) {
        // The shard ended: the next worker in turn keeps its place.
        turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(turn_));
        if (turn_ >= turns_.size()) turn_ = 0;
        continue;
      }
      turn_ = (turn_ + 1) % turns_.size();
      ++position_;
      return batch;
    }
    return std::nullopt;
  }

  // even_batches over a group: every rank says whether it has a real batch
  // and whether it has anything to stand in with; all ranks act on the same
  // votes, so they all continue, or all end, or all throw.
  bool vote(bool has_batch, bool has_stand_in) {
    at::Tensor mine = at::empty({2}, at::kLong);
    mine.data_ptr<int64_t>()[0] = has_batch ? 1 : 0;
    mine.data_ptr<int64_t>()[1] = has_stand_in ? 1 : 0;
    const std::vector<at::Tensor> all = vote_group_->all_gather(mine);
    bool any_batch = false;
    std::string empty;
    for (size_t r = 0; r < all.size(); ++r) {
      const auto* v = all[r].data_ptr<int64_t>();
      any_batch = any_batch || v[0] != 0;
      if (v[1] == 0) empty += (empty.empty() ? "" : ", ") + std::to_string(r);
    }
    TANDEM_CHECK_ARG(!any_batch || empty.empty(),
                     "StreamingLoader: rank(s) {} of {} have no batch at all in epoch {} while "
                     "other ranks still have data, so they have nothing to pad with. Give every "
                     "rank's shards at least one batch of samples (fewer shards: fewer workers "
                     "or ranks, or more samples). Outside the Accelerator, even_batches = false "
                     "lets ranks end at different batches if the loop has no per-batch "
                     "collective",
                     empty, all.size(), epoch_);
    return any_batch;
  }

  std::optional<Batch> next() {
    if (!active_) start_pass();
    std::optional<Batch> batch = next_real();
    if (!vote_group_) {
      if (!batch) end_pass();
      padding_ = false;
      return batch ? std::optional<Batch>(deliver(std::move(*batch))) : std::nullopt;
    }
    if (batch) last_real_ = *batch;
    if (!vote(batch.has_value(), last_real_.has_value())) {
      end_pass();
      return std::nullopt;
    }
    padding_ = !batch.has_value();
    if (padding_) {
      batch = last_real_;
      ++position_;
    }
    return deliver(std::move(*batch));
  }

  Batch deliver(Batch batch) const {
    const bool non_blocking = options_.non_blocking && options_.device.is_cuda();
    for (auto& t : batch) {
      if (t.device() != options_.device) t = t.to(options_.device, non_blocking);
    }
    return batch;
  }
};

StreamingLoader::StreamingLoader(StreamFactory factory, int64_t num_replicas, int64_t rank,
                                 StreamingLoaderOptions options, Collate collate)
    : impl_(std::make_unique<Impl>()) {
  validate_stream_options(options, num_replicas, rank);
  TANDEM_CHECK_ARG(static_cast<bool>(factory) && static_cast<bool>(collate),
                   "StreamingLoader: the stream factory or the collate is empty. Pass a "
                   "function (shard, epoch) -> SampleStream and a collate.");
  impl_->factory_ = std::move(factory);
  impl_->collate_ = std::move(collate);
  impl_->options_ = std::move(options);
  impl_->num_replicas_ = num_replicas;
  impl_->rank_ = rank;
}

StreamingLoader::StreamingLoader(StreamFactory factory, ProcessGroup& pg,
                                 StreamingLoaderOptions options, Collate collate)
    : StreamingLoader(std::move(factory), pg.world_size(), pg.rank(), std::move(options),
                      std::move(collate)) {
  // Shards are numbered rank * W + w: ranks with different W would overlap.
  at::Tensor mine = at::empty({2}, at::kLong);
  mine.data_ptr<int64_t>()[0] = impl_->readers();
  mine.data_ptr<int64_t>()[1] = impl_->options_.batch_size;
  const std::vector<at::Tensor> all = pg.all_gather(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    const auto* v = all[r].data_ptr<int64_t>();
    TANDEM_CHECK_ARG(v[0] == impl_->readers() && v[1] == impl_->options_.batch_size,
                     "StreamingLoader: rank {} reads {} shard(s) per rank with batch_size {} "
                     "but rank {} reads {} with batch_size {}. Shards are numbered rank * "
                     "num_workers + worker, so every rank must use the same num_workers (0 and "
                     "1 both read one shard), or samples are duplicated and lost; take both "
                     "from the config.",
                     pg.rank(), impl_->readers(), impl_->options_.batch_size, r, v[0], v[1]);
  }
  if (impl_->options_.even_batches) impl_->vote_group_ = &pg;
}

StreamingLoader::~StreamingLoader() = default;
StreamingLoader::StreamingLoader(StreamingLoader&&) noexcept = default;
StreamingLoader& StreamingLoader::operator=(StreamingLoader&&) noexcept = default;

void StreamingLoader::set_epoch(int64_t epoch) {
  impl_->end_pass();
  impl_->epoch_ = epoch;
}

int64_t StreamingLoader::epoch() const { return impl_->epoch_; }

void StreamingLoader::skip_first_batches(int64_t num_batches) {
  TANDEM_CHECK_ARG(num_batches >= 0,
                   "StreamingLoader::skip_first_batches: num_batches must be >= 0, got {}. "
                   "Pass the number of batches of this pass already consumed.",
                   num_batches);
  impl_->end_pass();
  impl_->pending_skip_ = num_batches;
}

std::optional<StreamingLoader::Batch> StreamingLoader::next() { return impl_->next(); }
bool StreamingLoader::padding() const { return impl_->padding_; }
int64_t StreamingLoader::position() const { return impl_->position_; }
const StreamingLoaderOptions& StreamingLoader::options() const { return impl_->options_; }

StreamingLoader::Iterator StreamingLoader::begin() {
  impl_->end_pass();
  return Iterator(this);
}

}  // namespace tandem
