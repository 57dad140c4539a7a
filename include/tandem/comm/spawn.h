#pragma once
// In-program launch: tandem::spawn(fn, nprocs) runs fn on nprocs worker
// processes of this machine, each with the rank environment `tandem launch`
// would give it, and returns when all have finished. What
// torch.multiprocessing.spawn and Accelerate's notebook_launcher are for
// Python: a job from inside a program (a test, a notebook kernel, a tool)
// that no launcher started.
//
//   tandem::spawn([](int rank) {
//     tandem::Accelerator accelerator;  // reads RANK, WORLD_SIZE, ... as usual
//     ...
//   }, 4);
//
// How: the workers are fork()ed children of the caller; each runs fn(rank)
// and _exit()s, so nothing is executed again and fn may capture anything.
// The caller hosts the rendezvous store (StoreServer on loopback, a fresh
// token) exactly as `tandem launch` does, and the workers join it.
//
// Rules that come with fork():
// * Create the Accelerator / ProcessGroup inside fn, never before spawn():
//   spawn() throws UsageError while this process holds a ProcessGroup of
//   more than one rank (its store, Gloo and shared-memory threads would be
//   missing in the children, with whatever locks they held).
// * Threads of the caller do not exist in the workers. LibTorch's intra-op
//   OpenMP pool does not survive fork(), so a worker forked from a process
//   that already runs other threads uses one intra-op thread (and spawn()
//   logs a warning once). With more than one worker and no OMP_NUM_THREADS,
//   each worker uses one thread anyway, as under `tandem launch`.
// * On a CUDA machine, call spawn() before this process touches the GPU: a
//   CUDA context cannot be used across fork().
//
// Workers share the caller's stdout and stderr (lines are not prefixed; a
// worker's buffered output is flushed when fn returns or throws) and read
// stdin from /dev/null. Each worker leads its own process group and dies
// with the caller (PR_SET_PDEATHSIG), so no process outlives spawn().

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "tandem/core/error.h"

namespace tandem {

struct SpawnOptions {
  int nprocs = 1;  // worker processes, ranks 0..nprocs-1 of a world of nprocs
  // Port of the rendezvous store on 127.0.0.1; 0: a free port from the kernel.
  int master_port = 0;
  // Limit for the whole job; 0: none. Past it every worker is stopped and
  // spawn() throws TimeoutError naming the ranks still running.
  std::chrono::milliseconds timeout{0};
  // After the first failure: SIGTERM to every other worker's process group,
  // then SIGKILL to those left after this long.
  std::chrono::milliseconds grace_period{3000};
  // Extra environment variables for every worker (e.g. TANDEM_CONFIG_FILE,
  // TANDEM_TIMEOUT_S). The rank variables spawn() sets itself (RANK,
  // WORLD_SIZE, LOCAL_RANK, MASTER_PORT, ...) are refused here.
  std::map<std::string, std::string> env;
};

// A worker failed: fn threw, or the process exited or was killed before fn
// returned. what() names the rank and carries the worker's own message.
class SpawnError : public Error {
 public:
  SpawnError(const std::string& message, int rank, std::string worker_message)
      : Error(message), rank_(rank), worker_message_(std::move(worker_message)) {}
  // The rank whose failure came first (the root cause).
  int rank() const { return rank_; }
  // That worker's exception text (what()), or how its process ended.
  const std::string& worker_message() const { return worker_message_; }

 private:
  int rank_;
  std::string worker_message_;
};

// Runs fn(rank) on options.nprocs forked workers and blocks until every
// worker has ended. Returns normally when each fn returned. Otherwise stops
// the rest (see grace_period), reaps every worker and throws SpawnError for
// the first failure; a tandem::CommError ("a peer went away") counts as the
// cause only when no worker failed otherwise. Throws UsageError for bad
// options or a live ProcessGroup, CommError when the store cannot bind the
// port, TimeoutError past options.timeout.
// Call from one thread at a time; fn runs in the workers only.
void spawn(const std::function<void(int rank)>& fn, const SpawnOptions& options);
void spawn(const std::function<void(int rank)>& fn, int nprocs);
// For fn that reads its rank from the environment (tandem::Accelerator).
void spawn(const std::function<void()>& fn, int nprocs);

}  // namespace tandem
