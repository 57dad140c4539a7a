// broadcast_coalesced: rank 0's values for a list of tensors, one
// collective per dtype and device.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "tandem/comm/process_group.h"

namespace tandem {

void broadcast_coalesced(ProcessGroup& pg, const std::vector<at::Tensor>& tensors, int root) {
  if (pg.world_size() == 1 || tensors.empty()) return;
  c10::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, group] : groups) {
    std::vector<at::Tensor> flat_views;
    for (const auto& t : group) flat_views.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    pg.broadcast(flat, root);
    std::int64_t offset = 0;
    for (auto& t : group) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace tandem
