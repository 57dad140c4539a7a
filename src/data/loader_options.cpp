#include "tandem/data/loader_options.h"

#include <ATen/Context.h>

#include "tandem/core/error.h"

namespace tandem {

void validate(const DistributedLoaderOptions& options) {
  TANDEM_CHECK_ARG(options.batch_size >= 1,
                   "DistributedLoaderOptions: batch_size must be >= 1, got {}. It is the "
                   "number of samples per batch on this process.",
                   options.batch_size);
  TANDEM_CHECK_ARG(options.prefetch >= 0,
                   "DistributedLoaderOptions: prefetch must be >= 0, got {}. Use 0 to fetch "
                   "batches synchronously, or the number of batches to prepare ahead.",
                   options.prefetch);
  TANDEM_CHECK_ARG(options.num_workers >= 0,
                   "DistributedLoaderOptions: num_workers must be >= 0, got {}. Use 0 to "
                   "assemble batches on the calling thread, or the number of worker threads.",
                   options.num_workers);
  TANDEM_CHECK_ARG(options.prefetch_factor >= 1,
                   "DistributedLoaderOptions: prefetch_factor must be >= 1, got {}. It is the "
                   "number of batches each worker may have in flight.",
                   options.prefetch_factor);
  TANDEM_CHECK_ARG(options.num_workers == 0 || options.prefetch == 0,
                   "DistributedLoaderOptions: both num_workers ({}) and prefetch ({}) are set. "
                   "prefetch is the one-thread form (num_workers = 1 with prefetch batches "
                   "waiting); with num_workers, set prefetch_factor instead and leave prefetch "
                   "at 0.",
                   options.num_workers, options.prefetch);
  TANDEM_CHECK_ARG(options.bucket_pool_batches >= 1,
                   "DistributedLoaderOptions: bucket_pool_batches must be >= 1, got {}. It is "
                   "the number of global batches sorted together by length.",
                   options.bucket_pool_batches);
  TANDEM_CHECK_ARG(options.sharding == DistributedLoaderOptions::Sharding::kSamples ||
                       (options.sample_lengths.empty() && !options.sampler_drop_last),
                   "DistributedLoaderOptions: sharding by batches (Accelerate's split_batches "
                   "or dispatch_batches) takes neither sample_lengths nor sampler_drop_last; "
                   "use drop_last, or the default sharding");
  TANDEM_CHECK_ARG(!options.split_batches ||
                       options.sharding != DistributedLoaderOptions::Sharding::kSamples,
                   "DistributedLoaderOptions: split_batches slices Accelerate's batches; set "
                   "sharding to kBatches or kDispatched too");
  TANDEM_CHECK_ARG(!options.device.is_cuda() || at::hasCUDA(),
                   "DistributedLoaderOptions: device is {} but this LibTorch has no usable "
                   "CUDA (CPU-only build, or no GPU visible). Use the CPU device, or build "
                   "against a CUDA LibTorch.",
                   options.device.str());
}

}  // namespace tandem
