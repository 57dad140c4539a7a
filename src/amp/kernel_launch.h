#pragma once
// The check after each launch of tandem's own CUDA kernels (amp/*_cuda.cu):
// a launch that failed (a bad configuration, no kernel image for this GPU)
// is an internal error naming the operation and the pass.

#include <cuda_runtime_api.h>

#include "tandem/core/error.h"

namespace tandem::cuda_kernels {

inline void check_launch(cudaError_t status, const char* operation, const char* pass) {
  TANDEM_CHECK(status == cudaSuccess, "{}: the {} kernel did not launch: {}", operation, pass,
               cudaGetErrorString(status));
}

}  // namespace tandem::cuda_kernels
