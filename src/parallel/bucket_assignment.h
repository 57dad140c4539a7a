#pragma once
// Which parameters share a gradient bucket.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem::detail {

// Groups `order` (indices into `params`) into buckets, walking `order` and
// closing a bucket once it holds at least its cap in bytes: the first bucket
// uses `first_cap_bytes`, the rest `cap_bytes`. Parameters of different dtype
// or device never share a bucket. A parameter larger than the cap gets a
// bucket of its own. Pure function.
std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& params,
                                                     const std::vector<std::size_t>& order,
                                                     std::int64_t first_cap_bytes,
                                                     std::int64_t cap_bytes);

}  // namespace tandem::detail
