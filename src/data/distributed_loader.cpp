#include "tandem/data/distributed_loader.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include <c10/util/StringUtil.h>

#include "data/batch_workers.h"
#include "tandem/comm/process_group.h"
#include "data/worker_threads.h"

namespace tandem {
namespace {

int64_t checked_tensor_rows(const std::vector<at::Tensor>& tensors) {
  TANDEM_CHECK_ARG(!tensors.empty(),
                   "DistributedLoader: no tensors given. Pass one tensor per field, e.g. "
                   "{{inputs, labels}}, each with one row per sample in dim 0.");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK_ARG(tensors[i].defined(), "DistributedLoader: tensor {} is undefined.", i);
    TANDEM_CHECK_ARG(tensors[i].dim() >= 1,
                     "DistributedLoader: tensor {} is 0-dimensional; every tensor needs a dim "
                     "0 with one row per sample (unsqueeze(0) a scalar).",
                     i);
    TANDEM_CHECK_ARG(tensors[i].size(0) == tensors[0].size(0),
                     "DistributedLoader: tensor {} has {} rows in dim 0 (shape {}) but tensor 0 "
                     "has {} (shape {}). Sample i is row i of every tensor, so all must have "
                     "the same size in dim 0.",
                     i, tensors[i].size(0), c10::str(tensors[i].sizes()), tensors[0].size(0),
                     c10::str(tensors[0].sizes()));
  }
  return tensors[0].size(0);
}

// Sample i is row i of every tensor; index_select gives the same contiguous
// batch as PyTorch's default_collate stacking t[i] one row at a time.
DistributedLoader::Fetch tensor_fetch(std::vector<at::Tensor> tensors) {
  return [tensors = std::move(tensors)](const std::vector<int64_t>& indices) {
    const at::Tensor index = at::from_blob(const_cast<int64_t*>(indices.data()),
                                           {static_cast<int64_t>(indices.size())}, at::kLong);
    DistributedLoader::Batch batch;
    batch.reserve(tensors.size());
    for (const auto& t : tensors) {
      batch.push_back(t.index_select(0, t.is_cpu() ? index : index.to(t.device())));
    }
    return batch;
  };
}

DistributedSampler make_sampler(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                const DistributedLoaderOptions& options) {
  DistributedSampler sampler(dataset_size, num_replicas, rank, options.shuffle, options.seed,
                             options.sampler_drop_last);
  if (!options.sample_lengths.empty()) {
    sampler.bucket_by_length(options.sample_lengths, options.batch_size,
                             options.bucket_pool_batches);
  }
  return sampler;
}

}  // namespace

struct DistributedLoader::Impl {
  Impl(Fetch fetch, DistributedSampler sampler, DistributedLoaderOptions options)
      : fetch_(std::move(fetch)), sampler_(std::move(sampler)), options_(std::move(options)) {
    compute_sizes();
  }

  // The epoch's order dealt as Accelerate's BatchSamplerShard deals it.
  std::vector<int64_t> batch_shard(const std::vector<int64_t>& order) const {
    return detail::accelerate_batch_shard(
        order, options_.batch_size, sampler_.num_replicas(), sampler_.rank(),
        options_.sharding == DistributedLoaderOptions::Sharding::kDispatched,
        options_.split_batches, options_.drop_last, options_.even_batches);
  }

  // The whole epoch's order: the sampler's permutation over one replica.
  std::vector<int64_t> epoch_order() const {
    DistributedSampler whole(sampler_.dataset_size(), 1, 0, sampler_.shuffle(), sampler_.seed());
    whole.set_epoch(sampler_.epoch());
    return whole.indices();
  }

  void compute_sizes() {
    if (options_.sharding != DistributedLoaderOptions::Sharding::kSamples) {
      std::vector<int64_t> identity(static_cast<size_t>(sampler_.dataset_size()));
      for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int64_t>(i);
      num_samples_ = static_cast<int64_t>(batch_shard(identity).size());
      num_batches_ = (num_samples_ + options_.batch_size - 1) / options_.batch_size;
      return;
    }
    num_samples_ = sampler_.num_samples();
    if (!options_.even_batches && !sampler_.drop_last()) {
      // Without padding rank r holds the real positions r, r + R, ... < n.
      const int64_t n = sampler_.dataset_size();
      const int64_t r = sampler_.rank();
      const int64_t replicas = sampler_.num_replicas();
      num_samples_ = n > r ? (n - r + replicas - 1) / replicas : 0;
    }
    const int64_t b = options_.batch_size;
    num_batches_ = options_.drop_last ? num_samples_ / b : (num_samples_ + b - 1) / b;
  }

  std::vector<int64_t> epoch_indices() const {
    if (options_.sharding != DistributedLoaderOptions::Sharding::kSamples) {
      return batch_shard(epoch_order());
    }
    std::vector<int64_t> indices = sampler_.indices();
    // Padding sits at the end of each rank's list, so dropping it is a cut.
    indices.resize(static_cast<size_t>(num_samples_));
    return indices;
  }

  // Runs on the worker threads when there are some, concurrently for
  // different b: reads only order_, fixed while a pass (and so its workers)
  // is alive.
  Batch prepare(int64_t b) const {
    const int64_t begin = b * options_.batch_size;
    const int64_t end = std::min(begin + options_.batch_size, num_samples_);
    Batch batch = fetch_(std::vector<int64_t>(order_.begin() + begin, order_.begin() + end));
    if (options_.pin_memory && options_.device.is_cuda()) {
      for (auto& t : batch) {
        if (t.is_cpu() && !t.is_pinned()) t = t.pin_memory();
      }
    }
    return batch;
  }

  // Runs on the consumer's thread: a copy issued here is ordered on the
  // stream the consumer will use the batch on. Issued from a worker thread
  // it would go to that thread's current stream, and a non_blocking
  // copy could still be in flight when the consumer's kernels read it.
  Batch deliver(Batch batch) const {
    const bool non_blocking = options_.non_blocking && options_.device.is_cuda();
    for (auto& t : batch) {
      if (t.device() != options_.device) t = t.to(options_.device, non_blocking);
    }
    return batch;
  }

  void start_pass() {
    end_pass();
    order_ = epoch_indices();
    next_batch_ = std::min(pending_skip_, num_batches_);
    pending_skip_ = 0;
    active_ = true;
    ++pass_;
    if (next_batch_ >= num_batches_) return;
    // prefetch = k is one worker with k finished batches waiting.
    const int64_t threads = options_.num_workers > 0 ? options_.num_workers
                            : options_.prefetch > 0  ? 1
                                                     : 0;
    if (threads == 0) return;
    const int64_t in_flight = options_.num_workers > 0
                                  ? options_.num_workers * options_.prefetch_factor
                                  : options_.prefetch + 1;
    workers_ = std::make_unique<detail::BatchWorkers>(
        [this](int64_t b) { return prepare(b); }, next_batch_, num_batches_, threads, in_flight);
  }

  void end_pass() {
    workers_.reset();  // joins the threads before order_ may change
    active_ = false;
  }

  // What the fetch threw for batch b, with where it happened; the original
  // stays reachable through std::rethrow_if_nested.
  [[noreturn]] void rethrow_fetch_error(std::exception_ptr error, int64_t b,
                                        const char* where) const {
    const int64_t begin = b * options_.batch_size;
    const int64_t end = std::min(begin + options_.batch_size, num_samples_);
    const std::string what = detail::exception_message(error);
    const std::string message = fmt::format(
        "DistributedLoader: the fetch failed on batch {} of epoch {} ({}; samples {}..{} of "
        "this rank's list, dataset indices starting {}): {}. The pass has ended; the next "
        "next() starts a new one. The original exception is nested "
        "(std::rethrow_if_nested).",
        b, sampler_.epoch(), where, begin, end - 1,
        order_.empty() ? -1 : order_[static_cast<size_t>(begin)], what);
    try {
      std::rethrow_exception(error);
    } catch (...) {
      std::throw_with_nested(Error(detail::decorate_error(message, __FILE__, __LINE__)));
    }
  }

  std::optional<Batch> next() {
    if (!active_) start_pass();
    if (next_batch_ >= num_batches_) {
      end_pass();
      return std::nullopt;
    }
    Batch batch;
    if (workers_) {
      detail::BatchWorkers::Result result = workers_->pop();
      if (result.error) {
        end_pass();
        rethrow_fetch_error(result.error, next_batch_,
                            fmt::format("worker {}", result.worker).c_str());
      }
      batch = std::move(result.batch);
    } else {
      try {
        batch = prepare(next_batch_);
      } catch (...) {
        end_pass();
        rethrow_fetch_error(std::current_exception(), next_batch_, "on the calling thread");
      }
    }
    ++next_batch_;
    return deliver(std::move(batch));
  }

  Fetch fetch_;
  DistributedSampler sampler_;
  DistributedLoaderOptions options_;
  int64_t num_samples_ = 0;
  int64_t num_batches_ = 0;
  int64_t pending_skip_ = 0;

  // The pass in progress.
  bool active_ = false;
  uint64_t pass_ = 0;
  std::vector<int64_t> order_;
  int64_t next_batch_ = 0;
  std::unique_ptr<detail::BatchWorkers> workers_;
};

DistributedLoader::DistributedLoader(std::vector<at::Tensor> tensors, int64_t num_replicas,
                                     int64_t rank, DistributedLoaderOptions options)
    : DistributedLoader(Fetch(), checked_tensor_rows(tensors), num_replicas, rank,
                        std::move(options)) {
  impl_->fetch_ = tensor_fetch(std::move(tensors));
}

DistributedLoader::DistributedLoader(std::vector<at::Tensor> tensors, ProcessGroup& pg,
                                     DistributedLoaderOptions options)
    : DistributedLoader(Fetch(), checked_tensor_rows(tensors), pg, std::move(options)) {
  impl_->fetch_ = tensor_fetch(std::move(tensors));
}

DistributedLoader::DistributedLoader(Fetch fetch, int64_t dataset_size, int64_t num_replicas,
                                     int64_t rank, DistributedLoaderOptions options) {
  validate(options);
  DistributedSampler sampler = make_sampler(dataset_size, num_replicas, rank, options);
  impl_ = std::make_unique<Impl>(std::move(fetch), std::move(sampler), std::move(options));
}

DistributedLoader::DistributedLoader(Fetch fetch, int64_t dataset_size, ProcessGroup& pg,
                                     DistributedLoaderOptions options) {
  validate(options);
  DistributedSampler sampler = make_sampler(dataset_size, pg.world_size(), pg.rank(), options);
  sampler.check_same_on_every_rank(pg);
  impl_ = std::make_unique<Impl>(std::move(fetch), std::move(sampler), std::move(options));
}

DistributedLoader::~DistributedLoader() = default;
DistributedLoader::DistributedLoader(DistributedLoader&&) noexcept = default;
DistributedLoader& DistributedLoader::operator=(DistributedLoader&&) noexcept = default;

int64_t DistributedLoader::size() const { return impl_->num_batches_; }
int64_t DistributedLoader::num_samples() const { return impl_->num_samples_; }

void DistributedLoader::set_epoch(int64_t epoch) {
  impl_->end_pass();
  impl_->sampler_.set_epoch(epoch);
}

int64_t DistributedLoader::epoch() const { return impl_->sampler_.epoch(); }

void DistributedLoader::skip_first_batches(int64_t num_batches) {
  TANDEM_CHECK_ARG(num_batches >= 0,
                   "DistributedLoader::skip_first_batches: num_batches must be >= 0, got {}. "
                   "Pass the number of batches of this epoch already consumed.",
                   num_batches);
  impl_->end_pass();
  impl_->pending_skip_ = num_batches;
}

void DistributedLoader::set_even_batches(bool even_batches) {
  impl_->end_pass();
  impl_->options_.even_batches = even_batches;
  impl_->compute_sizes();
}

std::optional<DistributedLoader::Batch> DistributedLoader::next() { return impl_->next(); }

std::vector<int64_t> DistributedLoader::epoch_indices() const { return impl_->epoch_indices(); }

const DistributedLoaderOptions& DistributedLoader::options() const { return impl_->options_; }
const DistributedSampler& DistributedLoader::sampler() const { return impl_->sampler_; }

DistributedLoader::Iterator DistributedLoader::begin() {
  impl_->start_pass();
  return Iterator(this, impl_->pass_);
}

DistributedLoader::Iterator::Iterator(DistributedLoader* loader, uint64_t pass)
    : loader_(loader), pass_(pass), batch_(loader->next()) {}

DistributedLoader::Iterator& DistributedLoader::Iterator::operator++() {
  const Impl& impl = *loader_->impl_;
  TANDEM_CHECK_ARG(impl.active_ && impl.pass_ == pass_,
                   "DistributedLoader: the pass being iterated was ended by set_epoch(), "
                   "skip_first_batches() or a new begin(). Call them between passes, not "
                   "inside the loop body.");
  batch_ = loader_->next();
  return *this;
}

}  // namespace tandem
