#pragma once
// split_between_processes: this rank's share of a list of work items (prompts,
// file names, rows of a tensor), as Accelerate's split_between_processes.
//
// n items over `world` ranks: contiguous slices in rank order, of n / world
// items each, the first n % world ranks one more. With apply_padding every
// rank gets ceil(n / world) items, the short ones filled up with copies of
// the input's last item, so a later gather sees equal sizes (drop the
// padding afterwards). Not a collective: a pure function of its arguments,
// thread-safe, and every rank computes its share without talking.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tandem {
namespace detail {

// [begin, end) of rank's slice of n items, and the length it has after
// padding (== end - begin without padding). Throws UsageError for a rank
// outside [0, world), world < 1, or padding an empty input.
struct SplitRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t length = 0;
};
SplitRange split_range(std::int64_t n, int rank, int world, bool apply_padding);

}  // namespace detail

// This rank's items, copied in order.
template <typename T>
std::vector<T> split_between_processes(const std::vector<T>& items, int rank, int world,
                                       bool apply_padding = false) {
  const detail::SplitRange range =
      detail::split_range(static_cast<std::int64_t>(items.size()), rank, world, apply_padding);
  std::vector<T> out(items.begin() + range.begin, items.begin() + range.end);
  while (static_cast<std::int64_t>(out.size()) < range.length) out.push_back(items.back());
  return out;
}

// This rank's rows (dim 0) of `items`: a view of items when no padding is
// needed, else a new tensor with copies of the last row appended. Throws
// UsageError for a 0-d tensor.
at::Tensor split_between_processes(const at::Tensor& items, int rank, int world,
                                   bool apply_padding = false);

}  // namespace tandem
