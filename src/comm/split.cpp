#include "tandem/comm/split.h"

#include <ATen/ATen.h>

#include "tandem/core/error.h"

namespace tandem {
namespace detail {

SplitRange split_range(std::int64_t n, int rank, int world, bool apply_padding) {
  TANDEM_CHECK_ARG(world >= 1, "split_between_processes: world size {} must be at least 1",
                   world);
  TANDEM_CHECK_ARG(rank >= 0 && rank < world,
                   "split_between_processes: rank {} is not below world size {}; pass the "
                   "process index and the number of processes",
                   rank, world);
  TANDEM_CHECK_ARG(!(apply_padding && n == 0 && world > 1),
                   "split_between_processes: cannot pad an empty input (there is no last item "
                   "to repeat); pass apply_padding=false or at least one item");
  const std::int64_t base = n / world;
  const std::int64_t extra = n % world;
  SplitRange range;
  range.begin = rank * base + std::min<std::int64_t>(rank, extra);
  range.end = range.begin + base + (rank < extra ? 1 : 0);
  // At world 1 the input comes back unchanged, padded or not (Accelerate's rule).
  range.length = apply_padding && world > 1 ? base + (extra > 0 ? 1 : 0) : range.end - range.begin;
  return range;
}

}  // namespace detail

at::Tensor split_between_processes(const at::Tensor& items, int rank, int world,
                                   bool apply_padding) {
  TANDEM_CHECK_ARG(items.defined() && items.dim() >= 1,
                   "split_between_processes: the tensor needs a dim 0 to split (got {}); "
                   "reshape a single value to {{1}}",
                   items.defined() ? "a 0-d tensor" : "an undefined tensor");
  const detail::SplitRange range = detail::split_range(items.size(0), rank, world, apply_padding);
  at::Tensor slice = items.slice(0, range.begin, range.end);
  const std::int64_t missing = range.length - (range.end - range.begin);
  if (missing == 0) return slice;
  at::Tensor last = items.slice(0, items.size(0) - 1, items.size(0));
  std::vector<std::int64_t> repeats(static_cast<size_t>(items.dim()), 1);
  repeats[0] = missing;
  return at::cat({slice, last.repeat(repeats)}, 0);
}

}  // namespace tandem
