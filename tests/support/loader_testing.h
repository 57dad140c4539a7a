#pragma once
// Helpers shared by the DistributedLoader tests (data, GPU): read batches
// back as plain index lists, which is what the specifications compare.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/data/distributed_loader.h"

namespace tandem::testing {

// The values of a 1-d integer tensor, on any device.
inline std::vector<int64_t> values(const at::Tensor& t) {
  const at::Tensor c = t.cpu().to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// Field `field` of every batch of one pass, as index lists.
inline std::vector<std::vector<int64_t>> drain(DistributedLoader& loader, size_t field = 0) {
  std::vector<std::vector<int64_t>> batches;
  for (auto& batch : loader) batches.push_back(values(batch.at(field)));
  return batches;
}

// `indices` cut into chunks of `size`, the last one possibly short.
inline std::vector<std::vector<int64_t>> chunks(const std::vector<int64_t>& indices, int64_t size) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < indices.size(); i += static_cast<size_t>(size)) {
    const size_t end = std::min(indices.size(), i + static_cast<size_t>(size));
    out.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(i),
                     indices.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

}  // namespace tandem::testing
