#include "tandem/comm/mesh.h"

#include <map>
#include <vector>

#include "core/text.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

void check_mesh_parent(const std::shared_ptr<ProcessGroup>& parent) {
  TANDEM_CHECK_ARG(parent != nullptr, "ProcessMesh: the parent group is null");
  TANDEM_CHECK_ARG(parent->is_member(),
                   "ProcessMesh: this rank is not a member of the parent group; build the mesh "
                   "on a group's members only");
}

// The number of ranks per host, from every rank's host id: the hosts must
// hold equally many ranks, each host's consecutively.
int mesh_ranks_per_host(const std::vector<std::string>& hosts) {
  std::vector<std::string> order;  // hosts in order of their first rank
  std::map<std::string, std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    const auto& host = hosts[static_cast<std::size_t>(r)];
    if (ranks.find(host) == ranks.end()) order.push_back(host);
    ranks[host].push_back(r);
  }
  const auto& first = ranks[order[0]];
  for (const auto& host : order) {
    const auto& mine = ranks[host];
    TANDEM_CHECK_ARG(mine.size() == first.size(),
                     "ProcessMesh: host '{}' holds {} rank(s) ({}) but host '{}' holds {} ({}); a "
                     "mesh needs as many ranks on every host. Launch the same number per host, "
                     "or pass an explicit shape",
                     order[0], first.size(), detail::rank_list(first), host, mine.size(),
                     detail::rank_list(mine));
    for (std::size_t i = 1; i < mine.size(); ++i) {
      TANDEM_CHECK_ARG(mine[i] == mine[0] + static_cast<int>(i),
                       "ProcessMesh: host '{}' holds ranks {}, which are not consecutive (rank {} "
                       "is on host '{}'); a mesh needs ranks numbered host by host, as tandem "
                       "launch and torchrun number them",
                       host, detail::rank_list(mine), mine[0] + static_cast<int>(i),
                       hosts[static_cast<std::size_t>(mine[0]) + i]);
    }
  }
  return static_cast<int>(first.size());
}

}  // namespace

ProcessMesh::ProcessMesh(std::shared_ptr<ProcessGroup> parent, std::array<int, 2> shape,
                         std::array<std::string, 2> dim_names)
    : parent_(std::move(parent)), shape_(shape), names_(std::move(dim_names)) {
  check_mesh_parent(parent_);
  build();
}

ProcessMesh::ProcessMesh(std::shared_ptr<ProcessGroup> parent,
                         std::array<std::string, 2> dim_names)
    : parent_(std::move(parent)), names_(std::move(dim_names)) {
  check_mesh_parent(parent_);
  const int per_host = mesh_ranks_per_host(parent_->all_gather_strings(parent_->host_id()));
  shape_ = {parent_->world_size() / per_host, per_host};
  build();
}

void ProcessMesh::build() {
  const int hosts = shape_[0];
  const int per_host = shape_[1];
  TANDEM_CHECK_ARG(hosts >= 1 && per_host >= 1,
                   "ProcessMesh: shape {{{}, {}}} has a dimension below 1; both dimensions must "
                   "be positive: pass {{hosts, ranks per host}} with hosts * ranks per host = {}",
                   hosts, per_host, parent_->world_size());
  // In 64 bits: two large dimensions would overflow an int.
  const long long ranks = static_cast<long long>(hosts) * per_host;
  TANDEM_CHECK_ARG(ranks == parent_->world_size(),
                   "ProcessMesh: shape {{{}, {}}} holds {} ranks but the group has {}; pass "
                   "{{hosts, ranks per host}} with hosts * ranks per host = {}",
                   hosts, per_host, ranks, parent_->world_size(), parent_->world_size());
  TANDEM_CHECK_ARG(!names_[0].empty() && !names_[1].empty() && names_[0] != names_[1],
                   "ProcessMesh: the dimension names '{}' and '{}' must be two different, "
                   "non-empty names",
                   names_[0], names_[1]);
  std::vector<std::vector<int>> across_hosts(static_cast<std::size_t>(per_host));
  std::vector<std::vector<int>> within_host(static_cast<std::size_t>(hosts));
  for (int r = 0; r < hosts * per_host; ++r) {
    across_hosts[static_cast<std::size_t>(r % per_host)].push_back(r);
    within_host[static_cast<std::size_t>(r / per_host)].push_back(r);
  }
  groups_[0] = parent_->split_group(std::move(across_hosts));
  groups_[1] = parent_->split_group(std::move(within_host));
}

int ProcessMesh::index_of(const std::string& dim) const {
  for (int d = 0; d < 2; ++d) {
    if (names_[static_cast<std::size_t>(d)] == dim) return d;
  }
  TANDEM_THROW(UsageError, "ProcessMesh: '{}' is not a dimension of this mesh; its dimensions are "
               "'{}' (size {}) and '{}' (size {})",
               dim, names_[0], shape_[0], names_[1], shape_[1]);
}

std::shared_ptr<ProcessGroup> ProcessMesh::group(const std::string& dim) const {
  return groups_[static_cast<std::size_t>(index_of(dim))];
}

int ProcessMesh::coordinate(const std::string& dim) const {
  const int rank = parent_->rank();
  return index_of(dim) == 0 ? rank / shape_[1] : rank % shape_[1];
}

int ProcessMesh::size(const std::string& dim) const {
  return shape_[static_cast<std::size_t>(index_of(dim))];
}

}  // namespace tandem
