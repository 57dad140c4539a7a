#pragma once
// ProfileSession: what Accelerator::profile() returns. While it lives,
// LibTorch's profiler (Kineto) records this process's CPU operators (and
// CUDA kernels when the device is CUDA), tandem's collectives
// ("tandem::all_reduce", ...) and DDP's buckets ("tandem::bucket <b>");
// stop() writes the rank's Chrome trace.
//
// Ranks as threads: the profiler is one per process, so ranks that share a
// process share one recording. The first rank to start turns it on for every
// thread; the last to stop turns it off and writes every rank's file, each
// holding the events of that rank's thread plus those of threads no rank
// owns (helper threads, process metadata). The other ranks' stop() waits
// for the files, so every file exists when stop() returns on any rank.
// One session at a time per process (UsageError for a second one while a
// recording that other ranks did not join is still on).
//
// Thread-safety: start and stop on the rank's training thread.

#include <memory>
#include <string>

namespace tandem {

class ProcessGroup;

struct ProfileOptions {
  // Where the traces go (created when missing): profile_<rank>.json. Required.
  std::string output_trace_dir;
  // Kineto's record_shapes, profile_memory, with_stack and with_flops.
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
};

class ProfileSession {
 public:
  // Turns the profiler on (or joins this process's recording) and waits on
  // a barrier of `group`, so every rank records from the same point.
  // Collective. Accelerator::profile() builds it; `cuda` adds CUDA
  // activities.
  ProfileSession(std::shared_ptr<ProcessGroup> group, const ProfileOptions& options, bool cuda);
  // stop(), unless an exception is unwinding (then the recording is
  // dropped without a barrier, so no rank waits on one that failed).
  ~ProfileSession();
  ProfileSession(ProfileSession&& other) noexcept;
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;
  ProfileSession& operator=(ProfileSession&&) = delete;

  // Barrier, then the profiler off and this rank's trace written (see
  // above for ranks as threads). Collective; once (later calls do nothing).
  void stop();
  // OUTPUT_TRACE_DIR/profile_<rank>.json.
  const std::string& trace_path() const { return path_; }

 private:
  void leave(bool write);
  std::shared_ptr<ProcessGroup> group_;
  std::string path_;
  bool active_ = false;
};

}  // namespace tandem
