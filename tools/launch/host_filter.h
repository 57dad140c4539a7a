#pragma once
// DeepSpeed-style --include / --exclude filters: "host1:0,1@host2:2".

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace tandem::cli {

// host -> slots; an empty set means "every slot of that host".
using HostSlots = std::map<std::string, std::set<int>>;

// Parses "host:0,1@host2" into {host: {0,1}, host2: {}}. Throws UsageError
// naming the flag and the bad part.
HostSlots parse_host_filter(const std::string& text, const char* flag);
// The same, in the order the filter names the hosts.
std::vector<std::pair<std::string, std::set<int>>> parse_host_filter_in_order(
    const std::string& text, const char* flag);

// Where this node's processes sit in the job.
struct NodeLayout {
  std::vector<int> slots;  // this node's slots (GPU ids when filtered)
  int node_rank = 0;
  int rank_offset = 0;  // the global rank of this node's first process
  int world_size = 0;   // selected slots over every node
};

// Lays out a job of `nnodes` nodes of `pool_size` slots each. One node, or
// no filter: every node runs the same slots (torchrun's contract). Several
// nodes and --include: the filter names every node, in node-rank order, with
// its slots (DeepSpeed's `host:0,1@host2:0` gives a world of 3); a host named
// without slots brings all `pool_size`. This node is the entry that names it
// by hostname or address, a localhost entry only when none does; `node_rank`,
// when given, must point at an entry that names this node. --exclude across
// nodes is refused: a node cannot know the others' slots, so the nodes would
// disagree on the world size. On one node, --exclude may name this node only.
NodeLayout layout_nodes(int pool_size, int nnodes, std::optional<int> node_rank,
                        const std::string& include, const std::string& exclude,
                        const std::vector<std::string>& names);

// Slots this node runs, given the pool 0..pool_size-1 and the filters
// (at most one of include/exclude may be non-empty). `names` are the names
// this node answers to (hostname, localhost, ...). Throws UsageError when
// this node is filtered out entirely or a slot of this node's entry is
// outside the pool.
std::vector<int> select_local_slots(int pool_size, const std::string& include,
                                    const std::string& exclude,
                                    const std::vector<std::string>& names);

}  // namespace tandem::cli
