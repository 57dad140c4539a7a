#pragma once
// Whether this CPU runs bf16 matrix products natively, and what they cost
// here when it does not.
//
// bf16 autocast on a CPU without AVX512_BF16 or AMX-BF16 still trains
// correctly, but LibTorch then emulates every bf16 matmul: on an AVX2-only
// machine a 256x512 by 512x512 product took 61-67x its fp32 time (torch
// 2.13, one thread). The Accelerator (on the main process, when bf16
// autocast runs on the CPU) and `tandem env` say so with the factor measured
// here and the remedy, so that a slow run is never a mystery.
//
// Thread-safe; reads /proc/cpuinfo and ONEDNN_MAX_CPU_ISA.

#include <string>

namespace tandem {

struct CpuBf16Support {
  // AVX512_BF16 or AMX-BF16 (x86), or BF16 (Arm) is present and
  // ONEDNN_MAX_CPU_ISA does not cap oneDNN below it.
  bool native = false;
  // What decided it, e.g. "avx512_bf16" or "no avx512_bf16 or amx_bf16 in
  // /proc/cpuinfo" or "ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN below bf16".
  std::string reason;
  // Time of a 64x128 by 128x128 bf16 matmul over the same fp32 one (best of
  // a few runs; a size both libraries run on one thread, so a loaded machine
  // does not skew it); 0 when not measured. Larger products are slower
  // still where bf16 is emulated.
  double slowdown = 0.0;
};

// Reads the CPU's features; with `measure`, also times the two matmuls
// (a few milliseconds).
CpuBf16Support cpu_bf16_support(bool measure);

// One sentence for a user who trains in bf16 on this CPU: the measured
// factor and the remedy (fp32 on this CPU). Empty when `support.native`.
std::string cpu_bf16_warning(const CpuBf16Support& support);

}  // namespace tandem
