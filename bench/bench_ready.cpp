// Spawn-to-ready probe: joins the job, waits for every rank, and prints
// `READY <rank> <unix_time_ns>` (CLOCK_REALTIME) before exiting.
//
// compare_spawn.py notes the time just before starting the launcher and
// takes the latest READY time as the moment the whole job could start
// training. bench_ready.py is the torch.distributed peer.

#include <chrono>
#include <cstdio>
#include <exception>

#include "tandem/tandem.h"

int main() {
  try {
    auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
    pg->barrier();
    // system_clock is CLOCK_REALTIME, comparable with Python's time.time_ns().
    auto now = std::chrono::system_clock::now().time_since_epoch();
    long long ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
    std::printf("READY %d %lld\n", pg->rank(), ns);
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ready: %s\n", e.what());
    return 1;
  }
  return 0;
}
