#pragma once
// The arithmetic of fused_cross_entropy's CUDA kernels, as host-and-device
// functions with no CUDA or LibTorch types, so that a CPU test runs the very
// same steps (tests/amp/test_cross_entropy.cpp emulates a block's threads
// with them) where no GPU is.
//
// A row's log-sum-exp is kept as a running pair (m, s): m the largest value
// seen, s the sum of exp(x - m) over the values seen. Pairs from different
// threads combine exactly (up to rounding) in any order, which is what lets
// every thread of a block take a strided part of the row and one tree
// reduction join them.
//
// Non-finite values behave as in PyTorch's log_softmax: a row with a NaN or
// +inf gives NaN, -inf entries contribute nothing, and a row of only -inf
// gives lse = -inf (so its loss is NaN).

#include <cmath>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TANDEM_HOST_DEVICE inline
#endif

namespace tandem::cross_entropy_math {

struct MaxSum {
  float m;  // the largest value seen (-inf: none, or only -inf)
  float s;  // sum of exp(x - m) over the values seen
};

TANDEM_HOST_DEVICE MaxSum empty_max_sum() { return {-INFINITY, 0.0f}; }

// Adds `n` values to a running pair. One exp per value plus one to rescale
// the pair when the chunk raises its maximum. fmaxf skips a NaN, so a NaN
// reaches the sum through its exp; a chunk whose maximum is -inf holds only
// -inf (and NaN), and adds nothing but the NaN.
TANDEM_HOST_DEVICE MaxSum add_values(MaxSum acc, const float* x, int n) {
  float m = acc.m;
  for (int k = 0; k < n; ++k) m = fmaxf(m, x[k]);
  if (m == -INFINITY) {
    for (int k = 0; k < n; ++k) {
      if (x[k] != x[k]) acc.s = NAN;
    }
    return acc;
  }
  float sum = 0.0f;
  for (int k = 0; k < n; ++k) sum += expf(x[k] - m);
  // acc.m == -inf gives exp(-inf) = 0 (nothing seen yet); m == +inf gives
  // NaN from inf - inf, as log_softmax does.
  return {m, acc.s * expf(acc.m - m) + sum};
}

// Joins two pairs.
TANDEM_HOST_DEVICE MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};  // both empty: 0, or NaN carried
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

TANDEM_HOST_DEVICE float log_sum_exp(MaxSum acc) { return acc.m + logf(acc.s); }

// d loss_row / d x_j for the row's target t, before the mean's scale.
TANDEM_HOST_DEVICE float softmax_minus_one_hot(float x, float lse, bool is_target) {
  return expf(x - lse) - (is_target ? 1.0f : 0.0f);
}

}  // namespace tandem::cross_entropy_math
