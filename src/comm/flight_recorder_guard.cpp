// Turns c10d's Flight Recorder off on the LibTorch releases where it can
// crash (compat::kFlightRecorderRaces: 2.11 and 2.12), unless the user asked
// for it.
//
// Why at load time: the recorder reads TORCH_FR_BUFFER_SIZE once, when the
// first process group records, and setenv() may not race with another
// thread's getenv(). A static initializer of libtandem runs before main()
// (or inside dlopen()), before any process group exists and, in every
// program we know of, before the program starts threads.
//
// When the race can still bite: a user who sets TORCH_FR_BUFFER_SIZE (or
// TORCH_NCCL_TRACE_BUFFER_SIZE) above 0 on those releases, and then has two
// process groups record their first collective at the same moment on two
// threads (ranks as threads in one process; tandem's own ZeRO thread does
// its collectives on the training rank's one group). docs/architecture.md,
// "LibTorch versions".

#include <cstdlib>

#include "comm/process_group_impl.h"
#include "core/torch_compat.h"

namespace tandem {
namespace {

bool turn_off_flight_recorder() {
  if constexpr (!compat::kFlightRecorderRaces) return false;
  if (std::getenv("TORCH_FR_BUFFER_SIZE") != nullptr ||
      std::getenv("TORCH_NCCL_TRACE_BUFFER_SIZE") != nullptr) {
    return false;  // the user's choice
  }
  return ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0) == 0;
}

const bool turned_off_at_load = turn_off_flight_recorder();

}  // namespace

// Called from ProcessGroup::create, which also keeps this file's initializer
// in a program that links a static libtandem.
bool detail::flight_recorder_turned_off() { return turned_off_at_load; }

}  // namespace tandem
