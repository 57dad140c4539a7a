#pragma once
// The single-threaded Adam loops behind cpu_adam_step(), one per ISA, each in
// its own file compiled with that ISA's flags and -ffp-contract=off
// (src/CMakeLists.txt). Private to src/optim.
//
// Every path computes, per element and in this order (float32, each step
// rounded, fma rounded once), the operations LibTorch's Adam step runs on
// AVX2 and AVX-512, where the multiply-adds are fmas:
//
//   Adam:   g = fma(p, weight_decay, g)             grad.add(p, wd)
//   AdamW:  p = p * param_decay                     p.mul_(1 - lr * wd)
//           m = fma(g, 1 - beta1, m * beta1)        exp_avg.mul_(b1).add_(g, 1 - b1)
//           v = fma((1 - beta2) * g, g, v * beta2)  exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2)
//           d = sqrt(v) / sqrt_bias_correction2 + eps
//           p = p + (neg_step_size * m) / d          p.addcdiv_(m, d, -step_size)
//
// sqrt, division and fma are correctly rounded everywhere, so the three paths
// agree bit for bit, and the contraction that would break that is off.
// LibTorch itself is not always correctly rounded: PyTorch 2.13's pip build
// takes sqrt from MKL's vector math, which is one ulp off on about a fifth of
// inputs, so against it the result agrees to float32 tolerance, not bitwise
// (Debian's 1.13 matched bit for bit). tests/optim/test_cpu_adam.cpp checks.

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace tandem::detail {

// The step's scalars, each rounded to float the way ATen rounds a Scalar.
struct AdamConstants {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;  // -lr / bias_correction1
  float weight_decay;   // Adam's L2 term; used when l2
  float param_decay;    // AdamW's 1 - lr * weight_decay; used when decoupled
  bool l2;
  bool decoupled;
};

// Updates elements [0, n) of the four arrays. No threads, no checks.
using AdamSpanFn = void (*)(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                            int64_t n, const AdamConstants& c);

void adam_span_scalar(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t n, const AdamConstants& c);
// Require AVX2 and FMA, or AVX-512F; never call them on a CPU without. On a
// non-x86 build they fall back to the scalar loop.
void adam_span_avx2(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    int64_t n, const AdamConstants& c);
void adam_span_avx512(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t n, const AdamConstants& c);

// One element, the scalar form of the sequence above: the reference every
// vector path must equal, and the AVX2 path's tail. Internal linkage on
// purpose: each kernel file compiles its own copy with its own ISA flags, and
// one shared inline copy could carry FMA instructions into the scalar path.
namespace {

template <bool kL2, bool kDecoupled>
inline void adam_element(float& p, float g, float& m, float& v, const AdamConstants& c) {
  if (kDecoupled) p = p * c.param_decay;
  if (kL2) g = std::fma(p, c.weight_decay, g);
  m = std::fma(g, c.one_minus_beta1, m * c.beta1);
  v = std::fma(c.one_minus_beta2 * g, g, v * c.beta2);
  const float d = std::sqrt(v) / c.sqrt_bias_correction2 + c.eps;
  p = p + (c.neg_step_size * m) / d;
}

// Calls fn(l2, decoupled) with std::bool_constant arguments for c's two
// flags, so that the loops carry no per-element branches.
template <typename Fn>
inline void dispatch_adam_flags(const AdamConstants& c, Fn&& fn) {
  using T = std::true_type;
  using F = std::false_type;
  if (c.l2) {
    c.decoupled ? fn(T{}, T{}) : fn(T{}, F{});
  } else {
    c.decoupled ? fn(F{}, T{}) : fn(F{}, F{});
  }
}

}  // namespace
}  // namespace tandem::detail
