#pragma once
// Shared by the GPU checks (tests/gpu, ctest label `gpu`): the skip when no
// GPU is present, and the figures file the GPU kit collects.
//
// Every check compares against the single-process run or against PyTorch on
// the same device; docs/gpu.md lists them. scripts/gpu_kit.sh run builds
// this binary on a GPU machine and runs it.
//
// Several ranks on one GPU run as processes, never as threads of one test:
// autograd runs the backward of every CUDA graph in a process on that
// device's one engine thread, so the backward of one rank thread waits
// behind another's, and a collective that blocks inside backward (DDP's
// last bucket, ZeRO's reduce-scatter) deadlocks until it times out (the
// first GPU run showed exactly that). launch_gpu_workers() starts this binary
// again under `tandem launch`, each process running one `Worker` test.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "support/subprocess.h"
#include "tandem/checkpoint/safetensors.h"
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

// Milliseconds per call of `fn` over `reps` calls after `warmups` calls, the
// GPU waited for before and after the timed calls.
inline double gpu_ms_per_call(int warmups, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmups; ++i) fn();
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count() /
         reps;
}

// Appends {"check": name, ...figures} as one JSON line to the file named by
// $TANDEM_GPU_FIGURES, which scripts/gpu_kit.sh run folds into summary.json.
// Does nothing when the variable is unset.
// --- Ranks as processes --------------------------------------------------

using NamedTensors = std::map<std::string, at::Tensor>;

// The folder a `Worker` test writes its results into, set by
// launch_gpu_workers(); empty when the test runs on its own (it then skips).
inline std::string gpu_worker_dir() {
  const char* dir = std::getenv("TANDEM_GPU_WORKER_DIR");
  return dir == nullptr ? "" : dir;
}

// The device a worker trains on: cuda:0 (every rank shares the one GPU), or
// $TANDEM_GPU_WORKER_DEVICE, a seam that lets the harness itself be tried on
// the CPU.
inline c10::Device gpu_worker_device() {
  const char* device = std::getenv("TANDEM_GPU_WORKER_DEVICE");
  return device == nullptr ? c10::Device(c10::kCUDA, 0) : c10::Device(device);
}

// Writes `tensors` (moved to the CPU) as DIR/<name>.rank<R>.safetensors.
inline void write_worker_result(const std::string& dir, const std::string& name, int rank,
                                const NamedTensors& tensors) {
  std::vector<std::pair<std::string, at::Tensor>> list;
  for (const auto& [key, value] : tensors) list.emplace_back(key, value.detach().cpu());
  write_safetensors(dir + "/" + name + ".rank" + std::to_string(rank) + ".safetensors", list);
}

// What rank `rank` wrote under `name`.
inline NamedTensors read_worker_result(const std::string& dir, const std::string& name,
                                       int rank) {
  SafetensorsReader reader(dir + "/" + name + ".rank" + std::to_string(rank) + ".safetensors");
  NamedTensors out;
  for (const auto& entry : reader.entries()) out[entry.name] = reader.read(entry.name);
  return out;
}

// Runs the test `worker` (Suite.Worker) of this binary as `world` processes
// through `tandem launch`, CUDA tensors over Gloo (NCCL refuses two ranks on
// one GPU), each writing into `dir`. Fails the calling test with the
// workers' output unless every rank exits 0.
inline void launch_gpu_workers(const std::string& worker, int world, const std::string& dir) {
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  std::vector<std::string> env = {"TANDEM_GPU_WORKER_DIR=" + dir, "TANDEM_CUDA_BACKEND=gloo",
                                  "TANDEM_TIMEOUT_S=60"};
  const auto result = run_process({bin("tandem"), "launch", "--nproc-per-node",
                                   std::to_string(world), "--standalone", self,
                                   "--gtest_filter=" + worker, "--gtest_color=no"},
                                  300, env);
  ASSERT_FALSE(result.timed_out) << worker << " did not finish in 300 s\n" << result.out
                                 << result.err;
  ASSERT_EQ(result.exit_code, 0) << worker << " failed:\n" << result.out << result.err;
  // Each rank ran the worker test, which must not have skipped.
  ASSERT_EQ(result.out.find("[  SKIPPED ]"), std::string::npos) << result.out;
}

// The distance between adjacent values of `dtype` (float32, bfloat16 or
// float16) at |v|, elementwise, subnormals included: one unit in the last
// place, for tolerances of kernels whose results are rounded to `dtype`.
inline at::Tensor unit_in_last_place(const at::Tensor& v, at::ScalarType dtype) {
  const double mantissa_bits = dtype == at::kBFloat16 ? 8 : dtype == at::kHalf ? 11 : 24;
  const double min_exponent = dtype == at::kHalf ? -14 : -126;  // of the normal numbers
  auto exponent = torch::floor(torch::log2(v.abs().clamp_min(1e-300))).clamp_min(min_exponent);
  return torch::pow(2.0, exponent - (mantissa_bits - 1));
}

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
