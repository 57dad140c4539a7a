#pragma once
// The synchronised half of SyncBatchNorm: batch statistics over every rank's
// batch, and the autograd function whose backward all-reduces the gradient
// statistics. Private to the library; SyncBatchNormImpl is the public face.

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "tandem/comm/process_group.h"

namespace tandem::detail {

// Per-channel statistics of the batch formed by concatenating every rank's
// input along dimension 0.
struct GlobalBatchStats {
  at::Tensor mean;     // [C], float (double for double inputs)
  at::Tensor var;      // [C], biased: what the batch is normalised with
  std::int64_t count;  // values per channel over all ranks
};

// Computes the global statistics of `input` (N, C, *) with ONE all-reduce of
// 2C + 1 doubles: [sum | sum of squares | count]. Each rank's sums come from
// its own (numerically stable) mean and variance and are combined in double,
// so the usual E[x^2] - E[x]^2 cancellation costs double, not float,
// precision. A rank may hold an empty batch. Collective: every rank of `pg`
// must call it, in the same order as its other collectives.
GlobalBatchStats all_reduce_batch_stats(const at::Tensor& input, ProcessGroup& pg);

// Normalises `input` with `stats` and applies the affine transform (weight
// and bias may be undefined). The returned tensor's backward all-reduces
// sum(dy) and sum(dy * xhat) per channel through `pg` (one collective, only
// when the input needs a gradient) and returns the global grad_input plus
// this rank's LOCAL grad_weight and grad_bias, as PyTorch's SyncBatchNorm
// does: DDP averages those later. Every rank must therefore run backward
// through each output it produced. Not twice differentiable.
at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const GlobalBatchStats& stats, double eps,
                           std::shared_ptr<ProcessGroup> pg);

}  // namespace tandem::detail
