// The AVX-512 Adam loop, 16 floats a vector (compiled with -mavx512f
// -ffp-contract=off, src/CMakeLists.txt; chosen at run time only on CPUs with
// AVX-512F). The tail runs as one masked vector through the same operations,
// so it needs no scalar code; masked-off lanes are neither read nor written.

#include "optim/cpu_adam_kernels.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tandem::detail {

#if defined(__AVX512F__)
// GCC 12 warns that _mm512_sqrt_ps's own placeholder vector (from
// _mm512_undefined_ps, which is meant to be undefined) "may be used
// uninitialized" where the intrinsic inlines (GCC bug 105593); nothing of
// ours is. Silenced for this file's vector code only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

struct Avx512Constants {
  explicit Avx512Constants(const AdamConstants& c)
      : beta1(_mm512_set1_ps(c.beta1)),
        one_minus_beta1(_mm512_set1_ps(c.one_minus_beta1)),
        beta2(_mm512_set1_ps(c.beta2)),
        one_minus_beta2(_mm512_set1_ps(c.one_minus_beta2)),
        sqrt_bc2(_mm512_set1_ps(c.sqrt_bias_correction2)),
        eps(_mm512_set1_ps(c.eps)),
        neg_step(_mm512_set1_ps(c.neg_step_size)),
        weight_decay(_mm512_set1_ps(c.weight_decay)),
        param_decay(_mm512_set1_ps(c.param_decay)) {}
  __m512 beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bc2, eps, neg_step, weight_decay,
      param_decay;
};

// The update of 16 elements held in registers.
template <bool kL2, bool kDecoupled>
inline __attribute__((always_inline)) void adam_vector(__m512& p, __m512 g, __m512& m, __m512& v,
                                                       const Avx512Constants& k) {
  if (kDecoupled) p = _mm512_mul_ps(p, k.param_decay);
  if (kL2) g = _mm512_fmadd_ps(p, k.weight_decay, g);
  m = _mm512_fmadd_ps(g, k.one_minus_beta1, _mm512_mul_ps(m, k.beta1));
  v = _mm512_fmadd_ps(_mm512_mul_ps(k.one_minus_beta2, g), g, _mm512_mul_ps(v, k.beta2));
  const __m512 d = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), k.sqrt_bc2), k.eps);
  p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(k.neg_step, m), d));
}

template <bool kL2, bool kDecoupled>
void adam_loop_avx512(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t n, const AdamConstants& c) {
  const Avx512Constants k(c);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(param + i);
    __m512 m = _mm512_loadu_ps(exp_avg + i);
    __m512 v = _mm512_loadu_ps(exp_avg_sq + i);
    adam_vector<kL2, kDecoupled>(p, _mm512_loadu_ps(grad + i), m, v, k);
    _mm512_storeu_ps(param + i, p);
    _mm512_storeu_ps(exp_avg + i, m);
    _mm512_storeu_ps(exp_avg_sq + i, v);
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 p = _mm512_maskz_loadu_ps(mask, param + i);
    __m512 m = _mm512_maskz_loadu_ps(mask, exp_avg + i);
    __m512 v = _mm512_maskz_loadu_ps(mask, exp_avg_sq + i);
    adam_vector<kL2, kDecoupled>(p, _mm512_maskz_loadu_ps(mask, grad + i), m, v, k);
    _mm512_mask_storeu_ps(param + i, mask, p);
    _mm512_mask_storeu_ps(exp_avg + i, mask, m);
    _mm512_mask_storeu_ps(exp_avg_sq + i, mask, v);
  }
}

}  // namespace

void adam_span_avx512(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t n, const AdamConstants& c) {
  dispatch_adam_flags(c, [&](auto l2, auto decoupled) {
    adam_loop_avx512<decltype(l2)::value, decltype(decoupled)::value>(param, grad, exp_avg,
                                                                      exp_avg_sq, n, c);
  });
}
#pragma GCC diagnostic pop

#else

void adam_span_avx512(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t n, const AdamConstants& c) {
  adam_span_scalar(param, grad, exp_avg, exp_avg_sq, n, c);
}

#endif

}  // namespace tandem::detail
