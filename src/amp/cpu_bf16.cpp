// Native bf16 on the CPU: read from /proc/cpuinfo, capped by oneDNN's own
// ISA limit, and measured with two small matmuls.

#include "tandem/amp/cpu_bf16.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace tandem {
namespace {

// The first processor's feature flags ("flags" on x86, "Features" on Arm).
std::vector<std::string> cpu_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    if (key != "flags" && key != "Features") continue;
    std::istringstream words(line.substr(colon + 1));
    return {std::istream_iterator<std::string>(words), {}};
  }
  return {};
}

// oneDNN's ISA names below the first one with bf16 instructions
// (AVX512_CORE_BF16): a cap at one of these keeps LibTorch's bf16 matmuls
// emulated even on a CPU that has them.
bool caps_below_bf16(std::string isa) {
  std::transform(isa.begin(), isa.end(), isa.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  static const std::array<const char*, 7> below = {
      "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "DEFAULT_NONE"};
  return std::find(below.begin(), below.end(), isa) != below.end();
}

// Best of `runs` timings of a @ b, in seconds.
double best_matmul_seconds(const at::Tensor& a, const at::Tensor& b, int runs) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    at::Tensor c = at::matmul(a, b);
    (void)c.data_ptr();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                              .count());
  }
  return best;
}

}  // namespace

CpuBf16Support cpu_bf16_support(bool measure) {
  CpuBf16Support support;
  const auto flags = cpu_flags();
  auto has = [&](const char* flag) {
    return std::find(flags.begin(), flags.end(), flag) != flags.end();
  };
  std::string found;
  for (const char* flag : {"avx512_bf16", "amx_bf16", "bf16"}) {
    if (has(flag)) {
      found = flag;
      break;
    }
  }
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (found.empty()) {
    support.reason = "no avx512_bf16 or amx_bf16 in /proc/cpuinfo";
  } else if (cap != nullptr && caps_below_bf16(cap)) {
    support.reason = fmt::format("{} present, but ONEDNN_MAX_CPU_ISA={} caps oneDNN below it",
                                 found, cap);
  } else {
    support.native = true;
    support.reason = found;
  }
  if (measure) {
    // Small enough that both libraries run it on the calling thread: a
    // product split over threads waits for every one of them to be
    // scheduled, and on a loaded machine that wait, not the arithmetic, is
    // what a 0.3 ms fp32 product would measure (1.3x seen under a compile).
    at::NoGradGuard no_grad;
    const at::Tensor a = at::ones({64, 128}) * 0.5;
    const at::Tensor b = at::ones({128, 128}) * 0.25;
    const at::Tensor a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16);
    best_matmul_seconds(a, b, 1);  // warm the BLAS and oneDNN's kernels up
    best_matmul_seconds(a16, b16, 1);
    // Interleaved, the same number of each: a burst of load then slows
    // both, not one of them (separate runs gave 0.0x and 2.3x on one
    // native-bf16 CPU under a load of 5).
    double fp32 = 1e30, bf16 = 1e30;
    for (int round = 0; round < 10; ++round) {
      fp32 = std::min(fp32, best_matmul_seconds(a, b, 2));
      bf16 = std::min(bf16, best_matmul_seconds(a16, b16, 1));
    }
    support.slowdown = fp32 > 0 ? bf16 / fp32 : 0.0;
  }
  return support;
}

std::string cpu_bf16_warning(const CpuBf16Support& support) {
  if (support.native) return "";
  const std::string factor =
      support.slowdown > 0
          ? fmt::format("a 64x128 by 128x128 bf16 matmul took {:.1f}x its fp32 time here "
                        "(larger ones are slower still: 61x at 256x512 by 512x512 on an "
                        "AVX2-only CPU)",
                        support.slowdown)
          : "bf16 matmuls run up to about 67x slower than fp32 on such CPUs";
  return fmt::format(
      "bf16 autocast without native bf16 matmuls ({}): LibTorch emulates them, and {}. "
      "Train in fp32 on this CPU (mixed_precision: no, or --mixed-precision no), or use a CPU "
      "with AVX512_BF16 or AMX, or a GPU.",
      support.reason, factor);
}

}  // namespace tandem
