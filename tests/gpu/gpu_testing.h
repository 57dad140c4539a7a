#pragma once
// Shared by the GPU checks (tests/gpu, ctest label `gpu`): the skip when no
// GPU is present, and the figures file the GPU kit collects.
//
// Every check compares against the single-process run or against PyTorch on
// the same device; docs/gpu.md lists them. scripts/gpu_kit.sh run builds
// this binary on a GPU machine and runs it.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "tandem/comm/process_group.h"

// Skips the calling test, saying why, when this process sees no CUDA device.
#define TANDEM_REQUIRE_CUDA()                                                           \
  do {                                                                                  \
    if (!torch::cuda::is_available()) {                                                 \
      GTEST_SKIP() << "needs a CUDA device (torch::cuda::is_available() is false here)"; \
    }                                                                                   \
  } while (0)

namespace tandem::testing {

// Ranks sharing one GPU talk over Gloo (NCCL refuses two ranks on a device).
inline ProcessGroupOptions gloo_on_cuda() {
  ProcessGroupOptions options;
  options.cuda_backend = CudaBackend::kGloo;
  return options;
}

// Appends {"check": name, ...figures} as one JSON line to the file named by
// $TANDEM_GPU_FIGURES, which scripts/gpu_kit.sh run folds into summary.json.
// Does nothing when the variable is unset.
inline void record_gpu_figures(const std::string& check, nlohmann::json figures) {
  const char* path = std::getenv("TANDEM_GPU_FIGURES");
  figures["check"] = check;
  std::printf("gpu figures: %s\n", figures.dump().c_str());
  if (path == nullptr || *path == '\0') return;
  if (std::FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", figures.dump().c_str());
    std::fclose(f);
  }
}

}  // namespace tandem::testing
