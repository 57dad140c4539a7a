#include "launch/hostfile.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "launch/host_filter.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

std::string strip_blanks(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

const HostfileHost* find_host(const std::vector<HostfileHost>& hosts, const std::string& name) {
  for (const auto& host : hosts) {
    if (host.name == name) return &host;
  }
  return nullptr;
}

}  // namespace

std::vector<HostfileHost> parse_hostfile(const std::string& text, const std::string& path) {
  std::vector<HostfileHost> hosts;
  std::istringstream in(text);
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    const std::string line = strip_blanks(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string name, slots, extra;
    words >> name >> slots >> extra;
    int count = 0;
    size_t used = 0;
    if (slots.rfind("slots=", 0) == 0) {
      try {
        count = std::stoi(slots.substr(6), &used);
      } catch (const std::exception&) {
        used = 0;
      }
    }
    TANDEM_CHECK_ARG(extra.empty() && used > 0 && used == slots.size() - 6 && count >= 1,
                     "hostfile {} line {}: '{}' is not 'HOST slots=N' (N >= 1, the processes "
                     "that host runs; DeepSpeed's format, e.g. 'worker-1 slots=4')",
                     path, number, line);
    TANDEM_CHECK_ARG(find_host(hosts, name) == nullptr,
                     "hostfile {} line {}: host '{}' is listed twice; give it once with all its "
                     "slots",
                     path, number, name);
    hosts.push_back({name, count});
  }
  TANDEM_CHECK_ARG(!hosts.empty(), "hostfile {} lists no host; write one 'HOST slots=N' line per "
                   "host", path);
  return hosts;
}

std::vector<HostfileHost> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK_ARG(in.good(), "--hostfile {}: cannot read the file", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

std::vector<SelectedHost> select_hostfile_slots(const std::vector<HostfileHost>& hosts,
                                                const std::string& include,
                                                const std::string& exclude,
                                                std::optional<int> num_nodes,
                                                std::optional<int> num_gpus,
                                                const std::string& path) {
  TANDEM_CHECK_ARG(include.empty() || exclude.empty(), "--include and --exclude: give one");
  TANDEM_CHECK_ARG((include.empty() && exclude.empty()) || (!num_nodes && !num_gpus),
                   "--include/--exclude choose the hosts and slots of --hostfile {}; "
                   "--num-nodes/--nnodes and --num-gpus/--nproc-per-node do too: give one or "
                   "the other",
                   path);
  auto check_filter = [&](const char* flag, const std::string& text) {
    auto entries = parse_host_filter_in_order(text, flag);
    for (const auto& [name, slots] : entries) {
      const HostfileHost* host = find_host(hosts, name);
      TANDEM_CHECK_ARG(host != nullptr, "{} '{}': host '{}' is not in the hostfile {}", flag,
                       text, name, path);
      for (int slot : slots) {
        TANDEM_CHECK_ARG(slot < host->slots,
                         "{} '{}': host '{}' has slots 0..{} in the hostfile {}, not {}", flag,
                         text, name, host->slots - 1, path, slot);
      }
    }
    return entries;
  };
  auto all_slots = [](int n) {
    std::vector<int> slots(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = i;
    return slots;
  };
  std::vector<SelectedHost> out;
  if (!include.empty()) {
    for (const auto& [name, slots] : check_filter("--include", include)) {
      const int pool = find_host(hosts, name)->slots;
      out.push_back({name, pool, slots.empty() ? all_slots(pool)
                                               : std::vector<int>(slots.begin(), slots.end())});
    }
  } else {
    const auto excluded = exclude.empty() ? decltype(check_filter("", "")){}
                                          : check_filter("--exclude", exclude);
    const int node_count = num_nodes.value_or(static_cast<int>(hosts.size()));
    TANDEM_CHECK_ARG(node_count >= 1 && node_count <= static_cast<int>(hosts.size()),
                     "--num-nodes {}: the hostfile {} has {} host(s)", node_count, path,
                     hosts.size());
    for (int i = 0; i < node_count; ++i) {
      const HostfileHost& host = hosts[static_cast<size_t>(i)];
      if (num_gpus) {
        TANDEM_CHECK_ARG(*num_gpus >= 1 && *num_gpus <= host.slots,
                         "--num-gpus {}: host '{}' has {} slot(s) in the hostfile {}",
                         *num_gpus, host.name, host.slots, path);
      }
      std::vector<int> slots = all_slots(num_gpus.value_or(host.slots));
      for (const auto& [name, gone] : excluded) {
        if (name != host.name) continue;
        if (gone.empty()) slots.clear();  // the whole host
        slots.erase(std::remove_if(slots.begin(), slots.end(),
                                   [&gone = gone](int s) { return gone.count(s) > 0; }),
                    slots.end());
      }
      if (!slots.empty()) out.push_back({host.name, host.slots, slots});
    }
  }
  TANDEM_CHECK_ARG(!out.empty(), "--hostfile {}: the filters leave no slot to run on", path);
  // Ranks follow the hostfile's order whatever order --include names the
  // hosts in, as DeepSpeed's parse_resource_filter orders them.
  const auto position = [&](const std::string& name) {
    return std::find_if(hosts.begin(), hosts.end(),
                        [&](const HostfileHost& h) { return h.name == name; }) -
           hosts.begin();
  };
  std::stable_sort(out.begin(), out.end(), [&](const SelectedHost& a, const SelectedHost& b) {
    return position(a.name) < position(b.name);
  });
  return out;
}

std::string include_filter(const std::vector<SelectedHost>& hosts) {
  std::string text;
  for (const auto& host : hosts) {
    if (!text.empty()) text += '@';
    text += host.name + ':';
    for (size_t i = 0; i < host.slots.size(); ++i) {
      text += (i ? "," : "") + std::to_string(host.slots[i]);
    }
  }
  return text;
}

}  // namespace tandem::cli
