#pragma once
// DataPreparation: Accelerator::prepare_data_loader and prepare_local_loader.
// It shards data across the ranks, sends batches to the training device,
// and wraps each loader so that it reports its position to the micro-step
// controller. It owns the training loader's cursor (the first loader
// prepared is the training data: checkpoints keep its position) and tells
// the Accelerator that loader's batch size, which completes the config's
// batch triple.
//
// Private to the Accelerator. Not thread-safe: the training thread calls it.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "accelerate/prepared_objects.h"
#include "tandem/data/distributed_loader.h"
#include "tandem/data/streaming_loader.h"

namespace tandem {

class PreparedLoader;
class PreparedStreamingLoader;
class ProcessGroup;

namespace detail {

class DataPreparation {
 public:
  // Called once, with the training loader's per-process batch size.
  using TrainingBatchHook = std::function<void(int64_t micro_batch)>;
  // `prepared` gives the current controller (free_memory() replaces it).
  // AcceleratorOptions' split_batches and dispatch_batches.
  struct Sharding {
    bool split_batches = false;
    bool dispatch_batches = false;
  };
  DataPreparation(std::shared_ptr<ProcessGroup> group, c10::Device device,
                  const PreparedObjects& prepared, TrainingBatchHook on_training_batch,
                  Sharding sharding);

  std::shared_ptr<PreparedLoader> prepare(std::vector<at::Tensor> tensors,
                                          DistributedLoaderOptions options);
  std::shared_ptr<PreparedLoader> prepare(DistributedLoader::Fetch fetch, int64_t dataset_size,
                                          DistributedLoaderOptions options);
  // A loader built in code, as it is.
  std::shared_ptr<PreparedLoader> wrap(DistributedLoader loader);
  // A StreamingLoader over the group (prepared_streaming.h).
  std::shared_ptr<PreparedStreamingLoader> prepare_streaming(StreamFactory factory,
                                                             StreamingLoaderOptions options,
                                                             StreamingLoader::Collate collate);

  // The training loader's position (null before one is prepared).
  const std::shared_ptr<LoaderCursor>& train_cursor() const { return train_cursor_; }
  // free_memory(): the next loader prepared is the training data again.
  void reset();

 private:
  // Batches go to the training device unless the caller named one, and are
  // dealt as Accelerate's loaders deal them with split_batches (batch_size
  // is then the global batch) or dispatch_batches.
  DistributedLoaderOptions on_device(DistributedLoaderOptions options) const;
  // With split_batches: the per-process share of a global `batch_size`
  // (UsageError naming `caller` unless the process count divides it).
  int64_t split_batch(int64_t batch_size, const char* caller) const;

  std::shared_ptr<ProcessGroup> group_;
  c10::Device device_;
  const PreparedObjects& prepared_;
  TrainingBatchHook on_training_batch_;
  Sharding sharding_;
  // The cursor of a new loader: the first one prepared is the training data.
  std::shared_ptr<LoaderCursor> new_cursor(int64_t batch_size);

  std::shared_ptr<LoaderCursor> train_cursor_;
};

}  // namespace detail
}  // namespace tandem
