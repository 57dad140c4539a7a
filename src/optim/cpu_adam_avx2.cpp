// The AVX2 + FMA Adam loop, 8 floats a vector (compiled with -mavx2 -mfma
// -ffp-contract=off, src/CMakeLists.txt; chosen at run time only on CPUs that
// have both). The tail of fewer than 8 elements takes the scalar sequence,
// which gives the same bits.

#include "optim/cpu_adam_kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace tandem::detail {

#if defined(__AVX2__) && defined(__FMA__)
namespace {

template <bool kL2, bool kDecoupled>
void adam_loop_avx2(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    int64_t n, const AdamConstants& c) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 sqrt_bc2 = _mm256_set1_ps(c.sqrt_bias_correction2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 neg_step = _mm256_set1_ps(c.neg_step_size);
  const __m256 weight_decay = _mm256_set1_ps(c.weight_decay);
  const __m256 param_decay = _mm256_set1_ps(c.param_decay);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = _mm256_loadu_ps(param + i);
    __m256 g = _mm256_loadu_ps(grad + i);
    __m256 m = _mm256_loadu_ps(exp_avg + i);
    __m256 v = _mm256_loadu_ps(exp_avg_sq + i);
    if (kDecoupled) p = _mm256_mul_ps(p, param_decay);
    if (kL2) g = _mm256_fmadd_ps(p, weight_decay, g);
    m = _mm256_fmadd_ps(g, one_minus_beta1, _mm256_mul_ps(m, beta1));
    v = _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g, _mm256_mul_ps(v, beta2));
    const __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), sqrt_bc2), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step, m), d));
    _mm256_storeu_ps(param + i, p);
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
  }
  for (; i < n; ++i) {
    adam_element<kL2, kDecoupled>(param[i], grad[i], exp_avg[i], exp_avg_sq[i], c);
  }
}

}  // namespace

void adam_span_avx2(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    int64_t n, const AdamConstants& c) {
  dispatch_adam_flags(c, [&](auto l2, auto decoupled) {
    adam_loop_avx2<decltype(l2)::value, decltype(decoupled)::value>(param, grad, exp_avg,
                                                                    exp_avg_sq, n, c);
  });
}

#else

void adam_span_avx2(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                    int64_t n, const AdamConstants& c) {
  adam_span_scalar(param, grad, exp_avg, exp_avg_sq, n, c);
}

#endif

}  // namespace tandem::detail
