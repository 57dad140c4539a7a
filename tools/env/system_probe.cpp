#include "env/system_probe.h"

#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/utsname.h>
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <torch/cuda.h>

// Device names need the CUDA runtime headers, which only a CUDA LibTorch has.
#if defined(TANDEM_WITH_NCCL) && __has_include(<ATen/cuda/CUDAContext.h>)
#include <ATen/cuda/CUDAContext.h>
#define TANDEM_ENV_CUDA_NAMES 1
#endif

#if defined(TANDEM_WITH_NCCL)
#include <torch/csrc/cuda/nccl.h>
#endif

#include "tandem/amp/cross_entropy.h"
#include "tandem/config/config.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"
#include "tandem/core/version.h"

namespace tandem::cli {
namespace {

constexpr const char* kReferenceBlasWarning =
    "LibTorch is using the reference BLAS, about 6x slower: install libopenblas0-openmp "
    "(scripts/setup.sh does)";

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return path;
  std::string result = resolved;
  std::free(resolved);
  return result;
}

bool contains(const std::string& haystack, const char* needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string compiler_string() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#else
  return "unknown";
#endif
}

// Fills the CPU section from /proc/cpuinfo (Linux); x86 reports "flags",
// ARM "Features". Only the first processor's entry is read.
// What a bug report needs to know of the machine itself, as accelerate env's
// "Platform" line: the distribution, kernel, C library and memory.
void probe_platform(SystemReport& report) {
  std::istringstream os_release(read_text_file("/etc/os-release"));
  for (std::string line; std::getline(os_release, line);) {
    if (line.rfind("PRETTY_NAME=", 0) != 0) continue;
    std::string value = line.substr(12);
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'')) {
      value = value.substr(1, value.size() - 2);
    }
    report.os = value;
  }
  utsname names{};
  if (::uname(&names) == 0) {
    report.kernel = std::string(names.sysname) + " " + names.release + " " + names.machine;
  }
#if defined(__GLIBC__)
  report.libc = std::string("glibc ") + ::gnu_get_libc_version();
#endif
  std::istringstream meminfo(read_text_file("/proc/meminfo"));
  for (std::string line; std::getline(meminfo, line);) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lld kB", &kib) == 1) {
      report.memory_bytes = static_cast<std::int64_t>(kib) * 1024;
    }
  }
}

void probe_cpu(SystemReport& report) {
  std::istringstream cpuinfo(read_text_file("/proc/cpuinfo"));
  std::string flags_line;
  for (std::string line; std::getline(cpuinfo, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && report.cpu_model.empty()) report.cpu_model = value;
    if ((key == "flags" || key == "Features") && flags_line.empty()) flags_line = value;
  }
  std::istringstream words(flags_line);
  std::vector<std::string> flags{std::istream_iterator<std::string>(words), {}};
  for (const char* flag :
       {"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"}) {
    report.cpu_flags.emplace_back(flag, std::find(flags.begin(), flags.end(), flag) != flags.end());
  }
  report.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t mask;
  report.usable_cpus =
      sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : report.logical_cpus;
}

// at::show_config() is the only place LibTorch states its runtime CPU
// capability and the BLAS it was built for, so pick those out of the text.
void probe_torch_config(SystemReport& report) {
  const std::string config = at::show_config();
  const std::string capability_tag = "CPU capability usage: ";
  auto at = config.find(capability_tag);
  if (at != std::string::npos) {
    at += capability_tag.size();
    report.aten_cpu_capability = config.substr(at, config.find('\n', at) - at);
  }
  for (const char* key : {"BLAS_INFO", "LAPACK_INFO", "BUILD_TYPE", "USE_CUDA", "USE_NCCL",
                          "USE_MPI", "USE_OPENMP", "USE_MKLDNN"}) {
    for (const char* prefix : {", ", ": "}) {
      auto start = config.find(std::string(prefix) + key + "=");
      if (start == std::string::npos) continue;
      start += std::string(prefix).size() + std::string(key).size() + 1;
      report.torch_build_settings.emplace_back(
          key, config.substr(start, config.find_first_of(",\n", start) - start));
      break;
    }
  }
}

// The text after `tag` up to the end of its line or the next comma.
std::string config_value(const std::string& config, const std::string& tag) {
  auto start = config.find(tag);
  if (start == std::string::npos) return "";
  start += tag.size();
  return config.substr(start, config.find_first_of(",\n", start) - start);
}

// Which LibTorch is loaded: its version and build come from at::show_config()
// (compiled into libtorch_cpu, so it describes the library, not tandem's
// headers), its ABI from the spelling of an exported c10 function that takes
// a std::string.
void probe_torch_runtime(SystemReport& report) {
  const std::string config = at::show_config();
  report.torch_version = config_value(config, "TORCH_VERSION=");
  // CUDA and cuDNN from the CUDA hooks, which libtorch_cuda registers when it
  // is loaded; they answer without a GPU (at::show_config() lists them only
  // when a device is present).
  const auto& hooks = at::detail::getCUDAHooks();
  if (hooks.hasCUDART()) {
    try {
      const long cudart = hooks.versionCUDART();  // 13000 for 13.0
      report.torch_cuda = fmt::format("{}.{}", cudart / 1000, cudart % 1000 / 10);
      const long cudnn = hooks.versionCuDNN();  // 92400 for 9.24.0
      report.torch_cudnn = fmt::format("{}.{}.{}", cudnn / 10000, cudnn / 100 % 100, cudnn % 100);
    } catch (const c10::Error&) {
      // A LibTorch built without cuDNN: leave what is unknown empty.
    }
  }
#if defined(TANDEM_WITH_NCCL)
  // torch packs NCCL's version as major << 32 | minor << 16 | patch.
  const std::uint64_t code = torch::cuda::nccl::version();
  report.torch_nccl = fmt::format("{}.{}.{}", code >> 32, (code >> 16) & 0xffff, code & 0xffff);
#endif
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&at::show_config), &info) != 0 && info.dli_fname != nullptr) {
    report.torch_library = real_path(info.dli_fname);
  }
  // c10::detail::torchCheckFail(const char*, const char*, uint32_t, const std::string&)
  if (dlsym(RTLD_DEFAULT, "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11"
                          "char_traitsIcESaIcEEE") != nullptr) {
    report.torch_cxx_abi = "cxx11";
  } else if (dlsym(RTLD_DEFAULT, "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs") != nullptr) {
    report.torch_cxx_abi = "pre-cxx11";
  } else {
    report.torch_cxx_abi = "unknown";
  }
}

void probe_cuda(SystemReport& report) {
  report.cuda_available = torch::cuda::is_available();
  report.cuda_device_count = static_cast<int>(torch::cuda::device_count());
  for (int i = 0; i < report.cuda_device_count; ++i) {
    CudaDeviceInfo device;
    device.index = i;
#if defined(TANDEM_ENV_CUDA_NAMES)
    const auto* properties = at::cuda::getDeviceProperties(i);
    device.name = properties->name;
    device.total_memory = static_cast<std::int64_t>(properties->totalGlobalMem);
#endif
    report.cuda_devices.push_back(device);
  }
}

// Real path of the library that serves `symbol` to the global scope, which
// is where libtorch_cpu's own undefined BLAS symbols bind; empty if none.
std::string library_defining(const char* symbol) {
  Dl_info info{};
  void* address = dlsym(RTLD_DEFAULT, symbol);
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return real_path(info.dli_fname);
}

// Names the BLAS in `library`: first by a symbol only that vendor exports,
// then by path (Debian's alternatives put each one in its own directory,
// e.g. .../openblas-openmp/, and the reference one in .../blas/).
std::string classify_blas(const std::string& library) {
  for (const auto& [symbol, vendor] : {std::pair{"openblas_get_config", "OpenBLAS"},
                                       {"bli_info_get_version_str", "BLIS"},
                                       {"MKL_Get_Version", "MKL"}}) {
    if (library_defining(symbol) == library) return vendor;
  }
  std::string lower = library;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const auto& [tag, vendor] : {std::pair{"openblas", "OpenBLAS"},
                                    {"flexiblas", "FlexiBLAS"},
                                    {"blis", "BLIS"},
                                    {"mkl", "MKL"},
                                    {"atlas", "ATLAS"},
                                    {"netlib", "reference"},
                                    {"reference", "reference"},
                                    {"/blas/libblas", "reference"}}) {
    if (contains(lower, tag)) return vendor;
  }
  // A bare libblas.so.N with no vendor's symbols is the reference build
  // (e.g. Arch's netlib package in /usr/lib).
  auto name = std::filesystem::path(library).filename().string();
  return name.rfind("libblas.so", 0) == 0 ? "reference" : "unknown";
}

// A rough figure to tell a tuned BLAS (tens of GFLOP/s and up) from the
// reference one (a few). Best of many short runs, capped at about 100 ms,
// because a threaded BLAS on a busy machine has slow outliers.
double time_gemm_gflops() {
  constexpr int64_t kSize = 256;
  at::Tensor a = at::randn({kSize, kSize});
  at::Tensor b = at::randn({kSize, kSize});
  at::mm(a, b);  // warm-up: the first call starts the BLAS thread pool
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(100);
  double best_seconds = 1e30;
  for (int i = 0; i < 50 && (i < 3 || Clock::now() < deadline); ++i) {
    auto start = Clock::now();
    at::mm(a, b);
    best_seconds =
        std::min(best_seconds, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return 2.0 * kSize * kSize * kSize / best_seconds / 1e9;
}

void probe_blas(SystemReport& report) {
  BlasInfo& blas = report.blas;
  // Loads and initialises the BLAS (some pick their kernels on first call).
  blas.gemm_gflops = time_gemm_gflops();

  // Ask the dynamic linker who serves sgemm_. Scanning the maps alone is not
  // enough: an OpenBLAS LAPACK can pull libopenblas in next to a reference
  // libblas, and then the reference one serves sgemm_.
  blas.library = library_defining("sgemm_");
  if (!blas.library.empty()) blas.vendor = classify_blas(blas.library);
  std::istringstream maps(read_text_file("/proc/self/maps"));
  for (std::string line; std::getline(maps, line);) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    std::string name = std::filesystem::path(path).filename().string();
    if (!contains(name, "blas") && !contains(name, "lapack") && !contains(name, "mkl") &&
        !contains(name, "blis")) {
      continue;
    }
    path = real_path(path);
    auto& mapped = blas.mapped_libraries;
    if (std::find(mapped.begin(), mapped.end(), path) == mapped.end()) mapped.push_back(path);
  }
  if (auto get_config = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    blas.openblas_config = get_config();
  }
  if (auto get_threads =
          reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"))) {
    blas.openblas_num_threads = get_threads();
  }
  // openblas_get_parallel(): 0 serial, 1 pthreads, 2 OpenMP.
  if (auto get_parallel = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
      get_parallel != nullptr && blas.vendor == "OpenBLAS") {
    int parallel = get_parallel();
    blas.variant = parallel == 2 ? "openmp" : parallel == 1 ? "pthread" : "serial";
  }
  // PyTorch wheels link MKL statically and keep sgemm_ hidden.
  if (blas.vendor == "unknown") {
    for (const auto& [key, value] : report.torch_build_settings) {
      if (key == "BLAS_INFO" && value == "mkl") blas.vendor = "MKL";
    }
  }
  if (blas.vendor == "reference") blas.warning = kReferenceBlasWarning;
}

// Mirrors Accelerate's lookup (HF_HOME, else $XDG_CACHE_HOME/huggingface)
// so an existing `accelerate config` is found until tandem has its own.
// The file `tandem launch` takes without --config-file, and that its
// workers' Accelerator then reads: select_config_file() itself, so this
// report cannot drift from what they do (TANDEM_CONFIG_FILE first, then the
// default files).
void probe_config(SystemReport& report) {
  tandem::ConfigEnv env;
  try {
    env = tandem::ConfigEnv::from_environment();
  } catch (const tandem::UsageError& e) {
    // Another TANDEM_* variable is malformed; the Accelerator would refuse
    // to start, which is worth reporting rather than failing on.
    report.config_warning = e.what();
    env = tandem::ConfigEnv::from_map({{"TANDEM_CONFIG_FILE", env_or_empty("TANDEM_CONFIG_FILE")},
                                       {"XDG_CACHE_HOME", env_or_empty("XDG_CACHE_HOME")},
                                       {"HOME", env_or_empty("HOME")},
                                       {"HF_HOME", env_or_empty("HF_HOME")}});
  }
  report.config_file = tandem::select_config_file("", env);
  if (!env.config_file.empty()) {
    report.config_source = "TANDEM_CONFIG_FILE";
    report.config_searched = {env.config_file};
    if (!fs::is_regular_file(env.config_file) && report.config_warning.empty()) {
      report.config_warning = fmt::format(
          "TANDEM_CONFIG_FILE={} is not a file: tandem launch and the Accelerator will fail to "
          "read it; fix the path or unset the variable",
          env.config_file);
    }
    return;
  }
  report.config_searched = tandem::default_config_candidates(env);
  if (!report.config_file.empty()) {
    report.config_source =
        report.config_file == tandem::default_config_path(env) ? "tandem" : "accelerate";
  }
}

}  // namespace

std::vector<std::string> report_warnings(const SystemReport& report) {
  std::vector<std::string> warnings;
  if (!report.torch_version.empty() && report.torch_version != report.torch_built_against) {
    warnings.push_back(fmt::format(
        "tandem was built against LibTorch {} but is running with LibTorch {} ({}); LibTorch has "
        "no stable C++ ABI across releases: rebuild tandem against {}, or make LibTorch {} the "
        "one loaded (LD_LIBRARY_PATH)",
        report.torch_built_against, report.torch_version,
        report.torch_library.empty() ? "path unknown" : report.torch_library,
        report.torch_version, report.torch_built_against));
  }
  if (report.torch_cxx_abi != "unknown" && !report.torch_cxx_abi.empty() &&
      report.torch_cxx_abi != report.cxx_abi) {
    warnings.push_back(fmt::format("tandem uses the {} std::string ABI but LibTorch uses {}; "
                                   "rebuild tandem with LibTorch's _GLIBCXX_USE_CXX11_ABI",
                                   report.cxx_abi, report.torch_cxx_abi));
  }
  if (!report.blas.warning.empty()) warnings.push_back(report.blas.warning);
  if (report.cpu_bf16 && !report.cpu_bf16->native) {
    warnings.push_back(tandem::cpu_bf16_warning(*report.cpu_bf16));
  }
  if (!report.rank_env_error.empty()) {
    warnings.push_back("the rank environment is malformed: " + report.rank_env_error);
  }
  if (!report.config_warning.empty()) warnings.push_back(report.config_warning);
  return warnings;
}

SystemReport probe_system(const tandem::RankEnv& env) {
  SystemReport report;
  report.tandem_version = tandem::version();
  report.torch_built_against = tandem::torch_version();
  report.cxx_abi = _GLIBCXX_USE_CXX11_ABI ? "cxx11" : "pre-cxx11";
  probe_torch_runtime(report);
  report.compiler = compiler_string();
  report.cxx_standard =
      "C++" + std::to_string(__cplusplus / 100 % 100) + " (" + std::to_string(__cplusplus) + ")";
#if defined(NDEBUG)
  report.build_type = "release (NDEBUG)";
#else
  report.build_type = "debug";
#endif

  report.gloo = true;  // c10d Gloo is required by the build (USE_C10D_GLOO).
#if defined(TANDEM_WITH_NCCL)
  report.nccl = true;
#endif
#if defined(USE_C10D_MPI)
  report.mpi = true;
#endif
  report.cuda_kernels = built_with_cuda_kernels();

  probe_platform(report);
  probe_cuda(report);
  probe_torch_config(report);
  probe_cpu(report);
  probe_blas(report);
  report.cpu_bf16 = tandem::cpu_bf16_support(/*measure=*/true);
  report.intra_op_threads = at::get_num_threads();
  report.inter_op_threads = at::get_num_interop_threads();
  report.omp_num_threads = env_or_empty("OMP_NUM_THREADS");
  report.rank_env = env;
  probe_config(report);
  return report;
}

}  // namespace tandem::cli
