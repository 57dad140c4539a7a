#pragma once
// The groups the comm tests run a collective on: the world group, or a
// subgroup of it made with new_group. The subgroups cover a group of one
// rank (local copies), groups that leave out rank 0 or a middle rank, and
// the brief's ranks {0, 2, 3} of 5, so that group ranks and global ranks
// differ in every way a mistake could confuse them.

#include <functional>
#include <string>
#include <vector>

#include "tandem/comm/process_group.h"

namespace tandem::testing {

// The subgroup used at each world size 1..5.
inline std::vector<int> subgroup_members(int world) {
  switch (world) {
    case 1: return {0};
    case 2: return {1};
    case 3: return {0, 2};
    case 4: return {1, 2, 3};
    default: return {0, 2, 3};
  }
}

// Calls fn(group) on the group under test: `world` itself, or (subgroup)
// the group of subgroup_members(world.world_size()), made on every rank and
// used on its members only. Collective over `world`.
inline void on_group(ProcessGroup& world, bool subgroup,
                     const std::function<void(ProcessGroup&)>& fn) {
  if (!subgroup) {
    fn(world);
    return;
  }
  auto group = world.new_group(subgroup_members(world.world_size()));
  if (group->is_member()) fn(*group);
}

// gtest parameter names: "world3_shm_subgroup".
inline std::string group_case_name(int world, bool shared_memory, bool subgroup) {
  return "world" + std::to_string(world) + (shared_memory ? "_shm" : "_gloo") +
         (subgroup ? "_subgroup" : "_world");
}

}  // namespace tandem::testing
