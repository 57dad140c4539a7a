#include "launch/cpu_affinity.h"

#include <sched.h>

#include <cerrno>
#include <cstring>

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

}  // namespace tandem::cli
