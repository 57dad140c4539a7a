#pragma once
// What `tandem env` reports: versions, backends, devices, CPU, BLAS, threads,
// the rank environment and the config file in effect.
//
// probe_system() gathers everything into a plain struct; to_json() and
// to_text() render it. Kept apart so tests can check the struct and the JSON
// without parsing the text.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/amp/cpu_bf16.h"
#include "tandem/core/rank_env.h"

namespace tandem::cli {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;                // empty when the build cannot query names
  std::int64_t total_memory = -1;  // bytes; -1 when unknown
};

// The BLAS that serves LibTorch's sgemm_ calls in this process.
struct BlasInfo {
  // "OpenBLAS", "BLIS", "MKL", "FlexiBLAS", "ATLAS", "reference" or
  // "unknown".
  std::string vendor = "unknown";
  // OpenBLAS threading flavour (openblas_get_parallel()): "openmp",
  // "pthread" or "serial"; empty for other vendors.
  std::string variant;
  // Real path of the library that serves sgemm_, empty when no loaded
  // library exports it (e.g. MKL linked statically into libtorch_cpu).
  std::string library;
  // Real paths of every BLAS/LAPACK-like library mapped into the process.
  std::vector<std::string> mapped_libraries;
  std::string openblas_config;    // openblas_get_config(), when present
  int openblas_num_threads = -1;  // openblas_get_num_threads(), when present
  double gemm_gflops = 0;         // best of a few 256x256 float at::mm calls
  // Set when the reference BLAS is in use; empty otherwise.
  std::string warning;
};

struct SystemReport {
  // Versions and the build of this binary.
  std::string tandem_version;
  // The LibTorch loaded in this process (at::show_config()'s TORCH_VERSION)
  // and the one tandem's headers came from; they must be the same release.
  std::string torch_version;
  std::string torch_built_against;
  std::string torch_library;        // real path of the loaded libtorch_cpu
  std::string torch_cuda;           // CUDA runtime LibTorch was built with; empty: CPU build
  std::string torch_cudnn;          // cuDNN it was built with; empty when none
  std::string torch_nccl;           // NCCL it loaded (builds with the NCCL backend); else empty
  std::string cxx_abi;              // tandem's std::string ABI: "cxx11" or "pre-cxx11"
  std::string torch_cxx_abi;        // LibTorch's, from its exported symbols; "unknown" if unseen
  std::string compiler;
  std::string cxx_standard;
  std::string build_type;  // "release (NDEBUG)" or "debug"

  // Communication backends compiled into tandem.
  bool gloo = false;
  bool nccl = false;
  bool mpi = false;
  // tandem's own CUDA kernels compiled in (fused_cross_entropy's).
  bool cuda_kernels = false;

  bool cuda_available = false;
  int cuda_device_count = 0;
  std::vector<CudaDeviceInfo> cuda_devices;

  // From at::show_config(): "CPU capability usage" and selected
  // "Build settings" entries (BLAS_INFO, USE_CUDA, ...), in that order.
  std::string aten_cpu_capability;
  std::vector<std::pair<std::string, std::string>> torch_build_settings;

  // The machine: "Debian GNU/Linux 12 (bookworm)" (/etc/os-release), the
  // kernel release (uname), the C library ("glibc 2.36") and the memory
  // (/proc/meminfo MemTotal); empty or -1 when unknown.
  std::string os;
  std::string kernel;
  std::string libc;
  std::int64_t memory_bytes = -1;

  std::string cpu_model;
  int logical_cpus = 0;  // CPUs in the machine
  int usable_cpus = 0;   // CPUs in this process's affinity mask
  // Flag name -> present in /proc/cpuinfo, in a fixed order.
  std::vector<std::pair<std::string, bool>> cpu_flags;
  // Native bf16 matmuls, and the measured bf16/fp32 time when emulated;
  // empty when not probed.
  std::optional<tandem::CpuBf16Support> cpu_bf16;

  int intra_op_threads = 0;
  int inter_op_threads = 0;
  std::string omp_num_threads;  // the variable's value, empty when unset

  BlasInfo blas;

  RankEnv rank_env;
  // Non-empty when RankEnv::from_environment() threw; rank_env then holds
  // defaults and the renderers show this text instead.
  std::string rank_env_error;

  // The config file in effect: what select_config_file() picks without a
  // --config-file flag (TANDEM_CONFIG_FILE, else the first default file
  // that exists); empty when none.
  std::string config_file;
  // "TANDEM_CONFIG_FILE", "tandem", "accelerate" or "none".
  std::string config_source = "none";
  // What was looked at, in order: the variable's path, else the defaults.
  std::vector<std::string> config_searched;
  // Why the config in effect would fail (a TANDEM_CONFIG_FILE that is not a
  // file, a malformed TANDEM_* variable); empty when none.
  std::string config_warning;
};

// Gathers the report for this process and machine, copying `env` in. Reads
// /proc, a few environment variables (OMP_NUM_THREADS, TANDEM_CONFIG_FILE and
// the other TANDEM_* config variables, HOME, XDG_CACHE_HOME, HF_HOME) and
// runs a few small matrix products to load and time the BLAS, so it takes
// tens of milliseconds. Never throws for a missing probe: fields
// it cannot fill keep their defaults. Not thread-safe with code that changes
// the environment.
SystemReport probe_system(const tandem::RankEnv& env);

// The problems the report found (reference BLAS, malformed rank
// environment, a config variable that would fail), one sentence each; empty
// when all is well.
std::vector<std::string> report_warnings(const SystemReport& report);

// The report as one JSON object (keys listed in docs and tests).
nlohmann::json to_json(const SystemReport& report);

// The report as aligned "key ...... value" lines under section headings,
// with warnings repeated loudly at the end. Ends with a newline.
std::string to_text(const SystemReport& report);

}  // namespace tandem::cli
