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

HostSlots parse_host_filter(const std::string& text, const char* flag) {
  HostSlots hosts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t at = text.find('@', start);
    std::string entry = text.substr(start, at == std::string::npos ? std::string::npos : at - start);
    TANDEM_CHECK_ARG(!entry.empty(), "{} '{}': empty host entry (format host:0,1@host2:2)", flag,
                     text);
    auto colon = entry.find(':');
    std::string host = entry.substr(0, colon);
    TANDEM_CHECK_ARG(!host.empty(), "{} '{}': an entry has no host name", flag, text);
    TANDEM_CHECK_ARG(!hosts.count(host), "{} '{}': host '{}' appears twice", flag, text, host);
    std::set<int>& slots = hosts[host];
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
    if (at == std::string::npos) break;
    start = at + 1;
  }
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
    std::vector<int> kept;
    std::copy_if(pool.begin(), pool.end(), std::back_inserter(kept),
                 [&](int slot) { return !mine->count(slot); });
    TANDEM_CHECK_ARG(!kept.empty(), "--exclude '{}' leaves no slot on this node", exclude);
    return kept;
  }
  return pool;
}

}  // namespace tandem::cli
