#include "launch/cpu_affinity.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "tandem/core/error.h"

namespace tandem::cli {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  TANDEM_CHECK(::sched_getaffinity(0, sizeof(set), &set) == 0,
               "enable_cpu_affinity: cannot read the launcher's CPU affinity: {}; remove "
               "enable_cpu_affinity from the config",
               std::strerror(errno));
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> cpu_share(const std::vector<int>& cpus, int local, int local_world) {
  if (cpus.empty() || local_world <= 0) return {};
  const int n = static_cast<int>(cpus.size());
  if (n < local_world) return {cpus[local % n]};
  const int base = n / local_world;
  const int extra = n % local_world;
  const int begin = local * base + (local < extra ? local : extra);
  const int length = base + (local < extra ? 1 : 0);
  return std::vector<int>(cpus.begin() + begin, cpus.begin() + begin + length);
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") +
           (j == i ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out;
}

void check_bind_core_list(const std::vector<int>& cores, const std::vector<int>& allowed,
                          int local_world) {
  const std::string given = cpu_list_text(cores);
  std::set<int> seen;
  for (int core : cores) {
    TANDEM_CHECK_ARG(std::binary_search(allowed.begin(), allowed.end(), core),
                     "--bind-core-list {}: core {} is not one this launcher may run on (its "
                     "CPUs: {}); list cores from those",
                     given, core, cpu_list_text(allowed));
    TANDEM_CHECK_ARG(seen.insert(core).second,
                     "--bind-core-list {}: core {} is listed twice; each rank pins to cores of "
                     "its own, so list every core once",
                     given, core);
  }
  TANDEM_CHECK_ARG(static_cast<int>(cores.size()) >= local_world,
                   "--bind-core-list {}: {} core(s) for {} local ranks; each rank needs at "
                   "least one core of its own: list at least {} cores (this launcher's CPUs: "
                   "{}), or start fewer processes per node",
                   given, cores.size(), local_world, local_world, cpu_list_text(allowed));
}

}  // namespace tandem::cli
