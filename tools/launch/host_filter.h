#pragma once
// DeepSpeed-style --include / --exclude filters: "host1:0,1@host2:2".

#include <map>
#include <set>
#include <string>
#include <vector>

namespace tandem::cli {

// host -> slots; an empty set means "every slot of that host".
using HostSlots = std::map<std::string, std::set<int>>;

// Parses "host:0,1@host2" into {host: {0,1}, host2: {}}. Throws UsageError
// naming the flag and the bad part.
HostSlots parse_host_filter(const std::string& text, const char* flag);

// Slots this node runs, given the pool 0..pool_size-1 and the filters
// (at most one of include/exclude may be non-empty). `names` are the names
// this node answers to (hostname, localhost, ...). Throws UsageError when
// this node is filtered out entirely or a slot is outside the pool.
std::vector<int> select_local_slots(int pool_size, const std::string& include,
                                    const std::string& exclude,
                                    const std::vector<std::string>& names);

}  // namespace tandem::cli
