#pragma once
// GroupRanks: which global ranks a process group holds, and how messages
// name its ranks.
//
// The world group names a rank as before ("rank 1", "ranks 0, 2"). A
// subgroup names both numbers, so that a message can be matched to the log
// of the process it talks about: "rank 3 (rank 1 of group [1, 3])".
// Immutable once built; thread-safe.

#include <string>
#include <vector>

namespace tandem::detail {

class GroupRanks {
 public:
  // The world group: group rank == global rank.
  GroupRanks() = default;
  // A subgroup whose group rank g is global rank members[g].
  explicit GroupRanks(std::vector<int> members);

  bool is_world() const { return !subgroup_; }
  // Global rank of `group_rank` (itself in the world group).
  int global(int group_rank) const;
  // The members' global ranks in group-rank order; empty for the world group.
  const std::vector<int>& members() const { return members_; }

  // "group [1, 3]"; empty for the world group.
  std::string label() const;
  // " in group [1, 3]", appended to the description of a collective; empty
  // for the world group.
  std::string suffix() const;
  // "rank 3 (rank 1 of group [1, 3])", "ranks 1, 3 (ranks 0, 1 of group
  // [1, 3])"; in the world group "rank 1", "ranks 1, 3".
  std::string name(const std::vector<int>& group_ranks) const;
  std::string name(int group_rank) const { return name(std::vector<int>{group_rank}); }

 private:
  bool subgroup_ = false;
  std::vector<int> members_;
};

// "[0, 2, 3]": a list of ranks as new_group takes it, for messages.
std::string bracketed_ranks(const std::vector<int>& ranks);

}  // namespace tandem::detail
