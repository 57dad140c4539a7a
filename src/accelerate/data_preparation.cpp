// DataPreparation (data_preparation.h): prepared loaders over the process
// group, reporting to the micro-step controller.

#include "accelerate/data_preparation.h"

#include "tandem/accelerate/prepared.h"
#include "tandem/accelerate/prepared_streaming.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {

DataPreparation::DataPreparation(std::shared_ptr<ProcessGroup> group, c10::Device device,
                                 const PreparedObjects& prepared,
                                 TrainingBatchHook on_training_batch, Sharding sharding)
    : group_(std::move(group)),
      device_(device),
      prepared_(prepared),
      on_training_batch_(std::move(on_training_batch)),
      sharding_(sharding) {}

int64_t DataPreparation::split_batch(int64_t batch_size, const char* caller) const {
  const int64_t world = group_->world_size();
  TANDEM_CHECK_ARG(batch_size % world == 0,
                   "{}: with split_batches the loader's batch_size ({}) is the global batch, "
                   "split evenly over the {} processes; make it a multiple of {}",
                   caller, batch_size, world, world);
  return batch_size / world;
}

DistributedLoaderOptions DataPreparation::on_device(DistributedLoaderOptions options) const {
  if (options.device.is_cpu()) options.device = device_;
  using Mode = DistributedLoaderOptions::Sharding;
  if (sharding_.split_batches) {
    options.batch_size = split_batch(options.batch_size, "prepare");
    options.split_batches = true;
    options.sharding = Mode::kBatches;
  }
  if (sharding_.dispatch_batches) options.sharding = Mode::kDispatched;
  return options;
}

// The loaders validate their options (once, in DistributedLoader's
// constructor) before wrap() lets the first one set the batch size.
std::shared_ptr<PreparedLoader> DataPreparation::prepare(std::vector<at::Tensor> tensors,
                                                         DistributedLoaderOptions options) {
  return wrap(DistributedLoader(std::move(tensors), *group_, on_device(options)));
}

std::shared_ptr<PreparedLoader> DataPreparation::prepare(DistributedLoader::Fetch fetch,
                                                         int64_t dataset_size,
                                                         DistributedLoaderOptions options) {
  return wrap(DistributedLoader(std::move(fetch), dataset_size, *group_, on_device(options)));
}

std::shared_ptr<LoaderCursor> DataPreparation::new_cursor(int64_t batch_size) {
  auto cursor = std::make_shared<LoaderCursor>();
  cursor->batch_size = batch_size;
  // The first loader is the training data: its batch is the micro batch of
  // the config's batch triple, and checkpoints keep its position
  // (evaluation loaders restart every pass anyway).
  if (train_cursor_ == nullptr) {
    on_training_batch_(batch_size);
    train_cursor_ = cursor;
  }
  return cursor;
}

std::shared_ptr<PreparedLoader> DataPreparation::wrap(DistributedLoader loader) {
  auto cursor = new_cursor(loader.options().batch_size);
  return PreparedAccess::make_loader(std::move(loader), prepared_.controller(), std::move(cursor),
                                     group_);
}

std::shared_ptr<PreparedStreamingLoader> DataPreparation::prepare_streaming(
    StreamFactory factory, StreamingLoaderOptions options, StreamingLoader::Collate collate) {
  if (options.device.is_cpu()) options.device = device_;
  // Accelerate ignores even_batches for iterable datasets for this reason.
  TANDEM_CHECK_ARG(options.even_batches || group_->world_size() == 1,
                   "prepare_streaming_loader: even_batches = false is not supported: ranks "
                   "would run out of batches at different steps, and the ranks still training "
                   "would wait forever in their next backward() or gather for a rank that has "
                   "stopped. Leave even_batches = true: a rank past its data then repeats its "
                   "last batch, marked padding(), until every rank has finished the pass (as "
                   "Accelerate evens iterable datasets whatever even_batches says)");
  if (sharding_.split_batches) {
    options.batch_size = split_batch(options.batch_size, "prepare_streaming_loader");
  }
  if (sharding_.dispatch_batches && group_->rank() == 0) {
    log_warn("prepare_streaming_loader: dispatch_batches does not apply to a streaming loader: "
             "each process reads its own shards of the stream (StreamShard) instead of "
             "receiving a slice of batches the main process drew, so the samples are the same "
             "but each rank gets other ones than under Accelerate's dispatcher");
  }
  StreamingLoader loader(std::move(factory), *group_, std::move(options), std::move(collate));
  auto cursor = new_cursor(loader.options().batch_size);
  cursor->shards = group_->world_size() * std::max<int64_t>(loader.options().num_workers, 1);
  return PreparedAccess::make_streaming_loader(std::move(loader), prepared_.controller(),
                                               std::move(cursor));
}

void DataPreparation::reset() { train_cursor_.reset(); }

}  // namespace tandem::detail
