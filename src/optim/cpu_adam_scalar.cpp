// The portable Adam loop: any CPU, compiled with the baseline flags (and
// -ffp-contract=off, src/CMakeLists.txt). Without FMA hardware std::fma is a
// library call, slow but exact, which keeps this path's bits equal to the
// vector paths'.

#include "optim/cpu_adam_kernels.h"

namespace tandem::detail {

void adam_span_scalar(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      int64_t n, const AdamConstants& c) {
  dispatch_adam_flags(c, [&](auto l2, auto decoupled) {
    for (int64_t i = 0; i < n; ++i) {
      adam_element<decltype(l2)::value, decltype(decoupled)::value>(param[i], grad[i],
                                                                     exp_avg[i], exp_avg_sq[i], c);
    }
  });
}

}  // namespace tandem::detail
