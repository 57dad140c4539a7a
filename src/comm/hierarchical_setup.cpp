// ProcessGroup::setup_hierarchy: builds the inner groups of the hierarchical
// collectives (hierarchical.h) once, while the group connects.
//
// Both are subgroups made with split_group, so they meet through this
// group's store under fresh prefixes and share its Gloo device: one group per
// host (shared memory when it holds several ranks) and one per local rank
// index across hosts (group 0: the hosts' lowest ranks, the leaders). They
// are made while the group sets itself up, so neither call is numbered or
// checked as one of the caller's collectives; the inner groups check no
// fingerprints of their own (the outer collective is checked once) and never
// go hierarchical themselves.

#include <algorithm>

#include "comm/process_group_impl.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {

void ProcessGroup::setup_hierarchy(const std::vector<std::string>& hosts) {
  auto layout = detail::HostLayout::from_host_ids(hosts, impl_->rank);
  if (!layout.hierarchical_helps()) return;
  const Hierarchical mode = impl_->options.hierarchical;
  if (mode == Hierarchical::kSplit && !layout.equal_hosts()) {
    std::string counts;
    for (const auto& h : layout.hosts) {
      counts += (counts.empty() ? "" : ", ") + detail::bracketed_ranks(h);
    }
    TANDEM_THROW(UsageError,
                 "hierarchical=split{} needs as many ranks on every host, but the hosts hold "
                 "ranks {}; use auto (the leader form for such layouts) or leader",
                 impl_->group.suffix(), counts);
  }
  const auto form = mode == Hierarchical::kLeader || !layout.equal_hosts()
                        ? detail::HierarchicalForm::kLeader
                        : detail::HierarchicalForm::kSplit;
  ProcessGroupOptions inner = impl_->options;
  inner.desync_check_collectives = 0;
  inner.debug_detail = false;
  inner.hierarchical = Hierarchical::kOff;
  auto local = make_subgroup("split_group", layout.hosts, &inner);
  std::size_t largest = 0;
  for (const auto& h : layout.hosts) largest = std::max(largest, h.size());
  std::vector<std::vector<int>> across;
  for (std::size_t j = 0; j < largest; ++j) across.push_back(layout.counterparts(j));
  auto cross = make_subgroup("split_group", std::move(across), &inner);
  // The steps inside a host need its shared memory: when a host could not
  // map it (setup_shared_memory logged why), every rank stays flat.
  const bool shm_ok = layout.mine().size() == 1 || local->uses_shared_memory();
  auto ok = all_gather_strings(shm_ok ? "1" : "0");
  if (std::find(ok.begin(), ok.end(), "0") != ok.end()) {
    if (impl_->rank == 0) {
      log_warn("hierarchical collectives{} are off: a host's ranks could not share memory; "
               "all-reduces across hosts use one flat Gloo group",
               impl_->group.suffix());
    }
    return;
  }
  log_debug("hierarchical collectives{} ({} form): {} hosts, this host's ranks {}",
            impl_->group.suffix(),
            form == detail::HierarchicalForm::kSplit ? "split" : "leader", layout.hosts.size(),
            detail::bracketed_ranks(layout.mine()));
  detail::ShmTransport* local_shm = local->impl_->shm.get();
  impl_->hier = std::make_unique<detail::Hierarchy>(std::move(layout), form, std::move(local),
                                                    local_shm, std::move(cross));
}

}  // namespace tandem
