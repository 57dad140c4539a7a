#pragma once
// Accelerate's enable_cpu_affinity for `tandem launch`: each local worker
// gets its own contiguous share of the CPUs the launcher may run on, so that
// the workers' threads do not migrate across each other's cores.

#include <string>
#include <vector>

namespace tandem::cli {

// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

// Worker `local` of `local_world`'s share of `cpus`: cpus split into
// local_world contiguous runs, as even as they go (the first runs one
// longer). With fewer CPUs than workers, worker i gets cpus[i % size].
// Disjoint whenever there are at least as many CPUs as workers.
std::vector<int> cpu_share(const std::vector<int>& cpus, int local, int local_world);

// "0-3,6,8-9": `cpus` (ascending or not) with runs of consecutive CPUs
// written as ranges. Pure.
std::string cpu_list_text(const std::vector<int>& cpus);

// deepspeed's --bind_core_list, checked before any worker starts: every
// core must be one `allowed` holds (this launcher's affinity), none twice,
// and at least one per local rank, so that each rank's share is its own.
// Throws UsageError naming the core at fault and how to fix the list.
void check_bind_core_list(const std::vector<int>& cores, const std::vector<int>& allowed,
                          int local_world);

}  // namespace tandem::cli
