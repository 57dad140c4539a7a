#include "parallel/bucket_assignment.h"

#include <map>
#include <tuple>

namespace tandem::detail {

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<at::Tensor>& params,
                                                     const std::vector<std::size_t>& order,
                                                     std::int64_t first_cap_bytes,
                                                     std::int64_t cap_bytes) {
  // One open bucket per (dtype, device); buckets are emitted in the order
  // they close, so launch order follows `order`.
  using Key = std::tuple<int, int, int>;
  struct Open {
    std::vector<std::size_t> members;
    std::int64_t bytes = 0;
  };
  std::map<Key, Open> open;
  std::vector<std::vector<std::size_t>> closed;
  auto cap = [&] { return closed.empty() ? first_cap_bytes : cap_bytes; };
  for (std::size_t index : order) {
    const at::Tensor& p = params[index];
    Key key{static_cast<int>(p.scalar_type()), static_cast<int>(p.device().type()),
            static_cast<int>(p.device().index())};
    Open& bucket = open[key];
    bucket.members.push_back(index);
    bucket.bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
    if (bucket.bytes >= cap()) {
      closed.push_back(std::move(bucket.members));
      bucket = Open{};
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.members.empty()) closed.push_back(std::move(bucket.members));
  }
  return closed;
}

}  // namespace tandem::detail
