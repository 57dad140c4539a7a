#include "launch/host_filter.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

int parse_slot(const std::string& text, const char* flag, const std::string& whole) {
  size_t used = 0;
  int slot = -1;
  try {
    slot = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TANDEM_CHECK_ARG(used == text.size() && slot >= 0,
                   "{} '{}': slot '{}' is not a non-negative integer (format host:0,1@host2:2)",
                   flag, whole, text);
  return slot;
}

// Which filter entry names this node, if any.
const std::set<int>* find_this_node(const HostSlots& hosts, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    auto it = hosts.find(name);
    if (it != hosts.end()) return &it->second;
  }
  return nullptr;
}

}  // namespace

std::vector<std::pair<std::string, std::set<int>>> parse_host_filter_in_order(
    const std::string& text, const char* flag) {
  std::vector<std::pair<std::string, std::set<int>>> hosts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t at = text.find('@', start);
    std::string entry = text.substr(start, at == std::string::npos ? std::string::npos : at - start);
    TANDEM_CHECK_ARG(!entry.empty(), "{} '{}': empty host entry (format host:0,1@host2:2)", flag,
                     text);
    auto colon = entry.find(':');
    std::string host = entry.substr(0, colon);
    TANDEM_CHECK_ARG(!host.empty(), "{} '{}': an entry has no host name", flag, text);
    for (const auto& [seen, unused] : hosts) {
      TANDEM_CHECK_ARG(seen != host, "{} '{}': host '{}' appears twice", flag, text, host);
    }
    std::set<int> slots;
    if (colon != std::string::npos) {
      std::string list = entry.substr(colon + 1);
      size_t s = 0;
      while (s <= list.size()) {
        size_t comma = list.find(',', s);
        slots.insert(parse_slot(list.substr(s, comma == std::string::npos ? std::string::npos : comma - s),
                                flag, text));
        if (comma == std::string::npos) break;
        s = comma + 1;
      }
    }
    hosts.emplace_back(host, std::move(slots));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return hosts;
}

HostSlots parse_host_filter(const std::string& text, const char* flag) {
  HostSlots hosts;
  for (auto& [host, slots] : parse_host_filter_in_order(text, flag)) hosts[host] = slots;
  return hosts;
}

std::vector<int> select_local_slots(int pool_size, const std::string& include,
                                    const std::string& exclude,
                                    const std::vector<std::string>& names) {
  TANDEM_CHECK_ARG(include.empty() || exclude.empty(),
                   "--include and --exclude cannot be used together; pick one");
  std::vector<int> pool;
  for (int i = 0; i < pool_size; ++i) pool.push_back(i);
  const std::string this_node = names.empty() ? "this node" : names.front();
  if (!include.empty()) {
    HostSlots hosts = parse_host_filter(include, "--include");
    const std::set<int>* mine = find_this_node(hosts, names);
    TANDEM_CHECK_ARG(mine != nullptr,
                     "--include '{}' does not name this node ({}); name it as it appears in "
                     "`hostname` or as localhost",
                     include, this_node);
    if (mine->empty()) return pool;
    for (int slot : *mine) {
      TANDEM_CHECK_ARG(slot < pool_size, "--include slot {} is outside this node's {} slots (0-{})",
                       slot, pool_size, pool_size - 1);
    }
    return std::vector<int>(mine->begin(), mine->end());
  }
  if (!exclude.empty()) {
    HostSlots hosts = parse_host_filter(exclude, "--exclude");
    const std::set<int>* mine = find_this_node(hosts, names);
    if (mine == nullptr) return pool;
    TANDEM_CHECK_ARG(!mine->empty(), "--exclude '{}' removes every slot of this node ({})",
                     exclude, this_node);
    for (int slot : *mine) {
      TANDEM_CHECK_ARG(slot < pool_size,
                       "--exclude slot {} is outside this node's {} slots (0-{}); name slots "
                       "this node has",
                       slot, pool_size, pool_size - 1);
    }
    std::vector<int> kept;
    std::copy_if(pool.begin(), pool.end(), std::back_inserter(kept),
                 [&](int slot) { return !mine->count(slot); });
    TANDEM_CHECK_ARG(!kept.empty(), "--exclude '{}' leaves no slot on this node", exclude);
    return kept;
  }
  return pool;
}

NodeLayout layout_nodes(int pool_size, int nnodes, std::optional<int> node_rank,
                        const std::string& include, const std::string& exclude,
                        const std::vector<std::string>& names) {
  NodeLayout layout;
  if (nnodes == 1 || (include.empty() && exclude.empty())) {
    if (nnodes == 1 && !exclude.empty()) {
      // A job of this node alone: a host that is not this node is a typo,
      // as DeepSpeed says ("Hostname ... not found").
      for (const auto& [host, slots] : parse_host_filter_in_order(exclude, "--exclude")) {
        TANDEM_CHECK_ARG(std::find(names.begin(), names.end(), host) != names.end(),
                         "--exclude '{}': host '{}' is not this node ({}), the only node of "
                         "this job; name it as it appears in `hostname` or as localhost",
                         exclude, host, names.empty() ? "this node" : names.front());
      }
    }
    layout.slots = select_local_slots(pool_size, include, exclude, names);
    const int local = static_cast<int>(layout.slots.size());
    layout.node_rank = node_rank.value_or(0);
    layout.rank_offset = layout.node_rank * local;
    layout.world_size = local * nnodes;
    return layout;
  }
  TANDEM_CHECK_ARG(exclude.empty(),
                   "--exclude '{}' with --nnodes {}: a node knows only its own slots, so the "
                   "nodes would disagree on the world size. Name every node and the slots it "
                   "runs with --include instead (host1:0,1@host2:0), in node-rank order",
                   exclude, nnodes);
  const auto hosts = parse_host_filter_in_order(include, "--include");
  TANDEM_CHECK_ARG(static_cast<int>(hosts.size()) == nnodes,
                   "--include '{}' names {} host(s) but --nnodes is {}: with several nodes it "
                   "names every node, in node-rank order",
                   include, hosts.size(), nnodes);
  // This node is the entry that names it. Every node answers to localhost,
  // so an entry naming it by hostname or address wins over a loopback one
  // (`localhost:0,1@otherhost:0` run on otherhost is node 1), and a given
  // --node-rank must point at an entry that names it.
  auto names_this_node = [&](int k, bool loopback_too) {
    const std::string& host = hosts[k].first;
    if (!loopback_too && (host == "localhost" || host == "127.0.0.1")) return false;
    return std::find(names.begin(), names.end(), host) != names.end();
  };
  int mine = -1;
  if (node_rank) {
    TANDEM_CHECK_ARG(*node_rank >= 0 && *node_rank < nnodes,
                     "--node-rank {} must be in [0, --nnodes={})", *node_rank, nnodes);
    TANDEM_CHECK_ARG(names_this_node(*node_rank, true),
                     "--node-rank {} disagrees with --include '{}', whose node {} is '{}', not "
                     "this node ({}); drop --node-rank (the filter's order numbers the nodes) "
                     "or reorder the filter",
                     *node_rank, include, *node_rank, hosts[*node_rank].first,
                     names.empty() ? "?" : names.front());
    mine = *node_rank;
  }
  for (bool loopback_too : {false, true}) {
    for (int k = 0; k < nnodes && mine < 0; ++k) {
      if (names_this_node(k, loopback_too)) mine = k;
    }
  }
  TANDEM_CHECK_ARG(mine >= 0,
                   "--include '{}' does not name this node ({}); name it as it appears in "
                   "`hostname` or by one of its addresses",
                   include, names.empty() ? "this node" : names.front());
  for (int slot : hosts[mine].second) {
    TANDEM_CHECK_ARG(slot < pool_size, "--include slot {} is outside this node's {} slots (0-{})",
                     slot, pool_size, pool_size - 1);
  }
  layout.node_rank = mine;
  if (hosts[mine].second.empty()) {
    for (int slot = 0; slot < pool_size; ++slot) layout.slots.push_back(slot);
  } else {
    layout.slots.assign(hosts[mine].second.begin(), hosts[mine].second.end());
  }
  for (int k = 0; k < nnodes; ++k) {
    const auto& slots = hosts[k].second;
    const int count = slots.empty() ? pool_size : static_cast<int>(slots.size());
    if (k < mine) layout.rank_offset += count;
    layout.world_size += count;
  }
  return layout;
}

}  // namespace tandem::cli
