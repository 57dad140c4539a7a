// ProcessGroup::new_group and split_group: groups of some of a group's ranks.
//
// Making a subgroup is a collective of the parent: the ranks exchange the
// lists they passed (so that a rank with another list is named instead of
// hanging), every rank counts the subgroup, and the members connect a Gloo
// group of their own through the parent's store under a fresh prefix. Ranks
// outside it get a handle that only says so.

#include <algorithm>
#include <map>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/process_group_impl.h"
#include "core/text.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

// "[0, 2]" or "[0, 1]; [2, 3]": the groups as the ranks compare and messages
// show them. Every list is sorted first, so the order of ranks does not count.
std::string describe_subgroups(const std::vector<std::vector<int>>& groups) {
  std::string text;
  for (const auto& group : groups) {
    text += (text.empty() ? "" : "; ") + detail::bracketed_ranks(group);
  }
  return text;
}

// Throws UsageError for an empty list, a rank outside [0, world) or a rank
// named twice (within a list or, for split_group, across lists).
void check_subgroups(const std::vector<std::vector<int>>& groups, int world, const char* op) {
  TANDEM_CHECK_ARG(!groups.empty(), "{}: no group was given; pass at least one list of ranks", op);
  // rank -> where it was first named: (index of its list, position in it)
  std::map<int, std::pair<std::size_t, std::size_t>> first;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    TANDEM_CHECK_ARG(!groups[g].empty(), "{}: the list of ranks is empty; a group needs a rank",
                     op);
    for (std::size_t i = 0; i < groups[g].size(); ++i) {
      const int r = groups[g][i];
      TANDEM_CHECK_ARG(r >= 0 && r < world,
                       "{}: rank {} is not a rank of the parent group, whose ranks are 0..{}; "
                       "pass the parent group's ranks (rank() on it), not global ones",
                       op, r, world - 1);
      auto [it, fresh] = first.emplace(r, std::make_pair(g, i));
      if (fresh) continue;
      const auto [g0, i0] = it->second;
      // new_group passes one list: its number would say nothing.
      const std::string list = groups.size() == 1 ? "" : fmt::format(" (list {})", g);
      TANDEM_CHECK_ARG(g0 != g,
                       "{}: rank {} is named twice in {}{}, at positions {} and {}; name each "
                       "rank once",
                       op, r, detail::bracketed_ranks(groups[g]), list, i0, i);
      TANDEM_THROW(UsageError,
                   "{}: rank {} is named twice: in list {} {} at position {} and in list {} {} "
                   "at position {}; a rank belongs to one group",
                   op, r, g0, detail::bracketed_ranks(groups[g0]), i0, g,
                   detail::bracketed_ranks(groups[g]), i);
    }
  }
}

// The error every rank passes through when the ranks passed different lists.
[[noreturn]] void throw_subgroup_mismatch(const std::vector<std::string>& texts,
                                          const detail::GroupRanks& parent, const char* op,
                                          const std::string& what) {
  std::vector<std::string> kinds;
  std::vector<std::vector<int>> ranks;
  for (int r = 0; r < static_cast<int>(texts.size()); ++r) {
    auto it = std::find(kinds.begin(), kinds.end(), texts[static_cast<std::size_t>(r)]);
    if (it == kinds.end()) {
      kinds.push_back(texts[static_cast<std::size_t>(r)]);
      ranks.emplace_back();
      it = kinds.end() - 1;
    }
    ranks[static_cast<std::size_t>(it - kinds.begin())].push_back(r);
  }
  std::string text;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    text += fmt::format("{}{} passed {}", i == 0 ? "" : (i == 1 ? " but " : " and "),
                        parent.name(ranks[i]), kinds[i]);
  }
  TANDEM_THROW(UsageError,
               "{}: the ranks passed different groups: {}. Every rank of the parent group calls "
               "{} with the same ranks, also the ranks left out of the group (as with "
               "torch.distributed.new_group)",
               what, text, op);
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks) {
  return make_subgroup("new_group", {std::move(ranks)});
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_group(std::vector<std::vector<int>> groups) {
  return make_subgroup("split_group", std::move(groups));
}

std::shared_ptr<ProcessGroup> ProcessGroup::make_subgroup(const char* op,
                                                          std::vector<std::vector<int>> groups,
                                                          const ProcessGroupOptions* child_options) {
  impl_->require_member(op);
  // As the caller wrote them: a repeated rank's positions are named in these.
  const std::vector<std::vector<int>> passed = groups;
  for (auto& group : groups) std::sort(group.begin(), group.end());
  const std::string mine = describe_subgroups(groups);
  std::string what = op;
  if (!impl_->is_local()) {
    auto call = impl_->begin(detail::CollectiveOp::kNewGroup, nullptr, "gloo");
    what = call.what;
    auto gathered = impl_->gather_bytes(std::vector<std::uint8_t>(mine.begin(), mine.end()), call);
    std::vector<std::string> texts;
    for (const auto& bytes : gathered) texts.emplace_back(bytes.begin(), bytes.end());
    if (std::any_of(texts.begin(), texts.end(), [&](const std::string& t) { return t != mine; })) {
      throw_subgroup_mismatch(texts, impl_->group, op, what);
    }
  }
  check_subgroups(passed, impl_->world_size, op);
  const std::uint64_t id = impl_->subgroups_made++;

  auto child = std::make_unique<Impl>();
  child->options = child_options != nullptr ? *child_options : impl_->options;
  const int self = impl_->group.global(impl_->rank);
  std::size_t index = groups.size();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto it = std::find(groups[g].begin(), groups[g].end(), impl_->rank);
    if (it != groups[g].end()) {
      index = g;
      child->rank = static_cast<int>(it - groups[g].begin());
    }
  }
  if (index == groups.size()) {
    std::vector<int> members;
    if (groups.size() == 1) {
      for (int r : groups[0]) members.push_back(impl_->group.global(r));
      child->outside = fmt::format(
          "rank {} is not a member of group {} (its ranks are {}). new_group returns a handle "
          "on every rank of the parent group; use it only on the members, e.g. behind `if "
          "(group->is_member())`",
          self, detail::bracketed_ranks(members), detail::rank_list(members));
    } else {
      child->outside = fmt::format(
          "rank {} is in none of the groups split_group made ({}). Use a group only on its "
          "members, e.g. behind `if (group->is_member())`, or list every rank in split_group",
          self, mine);
    }
    child->rank = -1;
    child->world_size = static_cast<int>(members.size());
    child->group = detail::GroupRanks(std::move(members));
    child->setting_up = false;
    return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(child)));
  }

  std::vector<int> members;
  for (int r : groups[index]) members.push_back(impl_->group.global(r));
  child->world_size = static_cast<int>(members.size());
  child->group = detail::GroupRanks(std::move(members));
  if (child->world_size == 1) {  // nothing to connect, as a world of 1
    child->setting_up = false;
    return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(child)));
  }
  child->store = c10::make_intrusive<c10d::PrefixStore>(
      fmt::format("group{}.{}", id, index), impl_->store);
  child->device = impl_->device;
  return connect(std::move(child));
}

}  // namespace tandem
