#pragma once
// Shared-memory segments left in /dev/shm by processes that died. tandem's
// segments are named "tandem-<creator pid>-<random>" and normally live in
// /dev/shm only until every rank has mapped them; a process killed in that
// window (a scancel, a node taken away, an OOM kill) leaves its name behind.

namespace tandem {

// Removes every segment process `pid` created; `tandem launch` calls it for
// each worker it reaps. Returns how many it removed.
int remove_shared_memory_of(int pid);

// Removes the segments whose creator no longer exists and that are older
// than `min_age_s` (so a live job in another pid namespace that shares
// /dev/shm is left alone). The first segment a process creates runs it,
// with 600 s. Returns how many it removed.
int remove_stale_shared_memory(double min_age_s);

}  // namespace tandem
