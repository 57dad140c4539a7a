#pragma once
// Elementwise reduction of N equally sized source buffers into one
// destination: the arithmetic of the shared-memory all-reduce.

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "tandem/comm/process_group.h"

namespace tandem::detail {

// dst[i] = op(src[0][i], ..., src[n-1][i]), then * scale when op is kAvg
// (scale = 1/n). dst may alias any src. Float and double take a fused path
// compiled with -O3; other dtypes go through ATen.
void reduce_buffers(void* dst, const void* const* srcs, int n, std::int64_t count,
                    c10::ScalarType dtype, ReduceOp op);

// True for dtypes reduce_buffers() handles.
bool reducible_dtype(c10::ScalarType dtype);

}  // namespace tandem::detail
