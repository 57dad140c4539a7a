#pragma once
// LibTorch version differences around devices: their memory and waiting for
// their work (see torch_compat.h).
// Private to the library: include only from src/.

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <torch/cuda.h>

namespace tandem::compat {

// Returns the CUDA caching allocator's unused blocks to the driver (Python's
// torch.cuda.empty_cache()); nothing without CUDA. c10::getDeviceAllocator
// (2.9+) reaches the CUDA allocator without linking torch_cuda directly, so
// a CPU build of libtandem calls it too.
inline void empty_cuda_cache() {
  if (!torch::cuda::is_available()) return;
  c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
}

// Waits until every kernel queued on `device` has finished (Python's
// torch.cuda.synchronize(device)); nothing for a CPU device. Reached
// through LibTorch's CUDA hooks, so a CPU build of libtandem links it too.
inline void synchronize_device(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace tandem::compat
