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
  TANDEM_CHECK_ARG(!options.device.is_cuda() || at::hasCUDA(),
                   "DistributedLoaderOptions: device is {} but this LibTorch has no usable "
                   "CUDA (CPU-only build, or no GPU visible). Use the CPU device, or build "
                   "against a CUDA LibTorch.",
                   options.device.str());
}

}  // namespace tandem
