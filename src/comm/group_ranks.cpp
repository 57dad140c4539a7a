#include "comm/group_ranks.h"

#include <fmt/format.h>

#include "core/text.h"

namespace tandem::detail {

GroupRanks::GroupRanks(std::vector<int> members) : subgroup_(true), members_(std::move(members)) {}

int GroupRanks::global(int group_rank) const {
  if (!subgroup_ || group_rank < 0 || group_rank >= static_cast<int>(members_.size())) {
    return group_rank;
  }
  return members_[static_cast<std::size_t>(group_rank)];
}

std::string GroupRanks::label() const {
  return subgroup_ ? "group " + bracketed_ranks(members_) : std::string();
}

std::string GroupRanks::suffix() const { return subgroup_ ? " in " + label() : std::string(); }

std::string GroupRanks::name(const std::vector<int>& group_ranks) const {
  const char* noun = group_ranks.size() == 1 ? "rank" : "ranks";
  if (!subgroup_) return fmt::format("{} {}", noun, rank_list(group_ranks));
  std::vector<int> globals;
  for (int g : group_ranks) globals.push_back(global(g));
  return fmt::format("{} {} ({} {} of {})", noun, rank_list(globals), noun, rank_list(group_ranks),
                     label());
}

std::string bracketed_ranks(const std::vector<int>& ranks) { return "[" + rank_list(ranks) + "]"; }

}  // namespace tandem::detail
