#pragma once
// Unscaling gradients and finding inf/NaN in them, fused into one pass.
//
// After backward() on a scaled loss every gradient holds scale * g. Before
// the optimizer step each must be multiplied by 1 / scale and checked for
// inf/NaN; doing both in one pass reads and writes the memory once, which
// matters because the work is memory-bound. Pass the per-parameter gradients,
// or, for DDP, the flat bucket buffers they are views into (not both: a
// tensor listed twice, or two overlapping ones, would be scaled twice).
//
// Thread-safety: the functions keep no state; concurrent calls must not share
// tensors.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace tandem {

class ProcessGroup;

struct UnscaleOptions {
  // Elements per task when one CPU tensor is split across at::parallel_for
  // threads. A test seam: small values exercise the multithreaded path.
  int64_t grain_size = 1 << 16;
};

// Multiplies every element of every tensor by inv_scale, in place, and
// returns true when any result is inf or NaN.
//
// CPU tensors of float32, float64, float16 and bfloat16: one pass per tensor
// over its memory, multithreaded for large tensors. Each element becomes
// exactly what `t.mul_(inv_scale)` gives for float32/float64 (inv_scale is
// first rounded to the tensor's compute type: float for float32, float16 and
// bfloat16), and the float16/bfloat16 product is rounded to the storage type
// as a float -> half conversion does. The check looks at the stored result,
// so it also catches a finite value that inv_scale > 1 pushes past the
// dtype's range. When inv_scale is exactly 1 nothing is written. A
// non-contiguous tensor goes through a contiguous copy.
//
// CUDA tensors go through torch's _amp_foreach_non_finite_check_and_unscale_
// (one launch per device, then one host synchronisation), which checks the
// values before the multiply; the two differ only when inv_scale > 1.
//
// Undefined tensors (parameters without a gradient) and empty ones are
// skipped, and a tensor listed more than once is unscaled once. Throws
// UsageError on other dtypes, sparse tensors, or devices other than CPU and
// CUDA, before changing any tensor.
bool unscale_and_find_inf(at::TensorList tensors, double inv_scale,
                          const UnscaleOptions& options = {});

// True on every rank when `found_inf` is true on any rank: a MAX all-reduce
// of one number. Ranks that skip the optimizer step must agree on it, or
// their replicas drift apart (with ZeRO each rank checks only its shard).
// A collective: every rank of `group` must call it, in the same order as
// the group's other collectives. At world size 1 it returns `found_inf`.
bool any_rank_found_inf(ProcessGroup& group, bool found_inf);

}  // namespace tandem
