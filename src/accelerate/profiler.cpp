// Accelerator::profile(): one Kineto recording per process, shared by the
// ranks that live in it (ranks as threads), written as one Chrome trace per
// rank. Kineto is process-global: two threads each enabling it crash, which
// is why ranks join one recording instead of starting their own.

#include "tandem/accelerate/profiler.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <exception>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/torch_compat_profiler.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace profiler_detail {

struct Member {
  long tid = 0;
  std::string path;
};

// This process's recording.
struct Recording {
  std::mutex mutex;
  std::condition_variable changed;  // a rank left, or the traces were written
  bool on = false;
  long starter = 0;           // the thread that turned the profiler on
  int active = 0;             // ranks in the recording that have not stopped
  int64_t generation = 0;     // recordings written so far
  std::vector<Member> members;
  std::string error;          // writing the last recording failed: why
};

Recording& recording() {
  static Recording r;
  return r;
}

long this_thread_id() { return static_cast<long>(::syscall(SYS_gettid)); }

// Splits the process trace at `all` into one file per member: its thread's
// events and those of threads no member owns.
void split_trace(const std::string& all, const std::vector<Member>& members) {
  nlohmann::json trace;
  {
    std::ifstream in(all);
    TANDEM_CHECK(in.good(), "profile: cannot read the trace '{}' the profiler wrote", all);
    in >> trace;
  }
  std::set<long> owned;
  for (const auto& m : members) owned.insert(m.tid);
  const nlohmann::json events = trace.value("traceEvents", nlohmann::json::array());
  for (const auto& m : members) {
    nlohmann::json mine = nlohmann::json::array();
    for (const auto& e : events) {
      const auto tid = e.find("tid");
      const bool numeric = tid != e.end() && tid->is_number_integer();
      if (!numeric || tid->get<long>() == m.tid || owned.count(tid->get<long>()) == 0) {
        mine.push_back(e);
      }
    }
    nlohmann::json out = trace;
    out["traceEvents"] = std::move(mine);
    std::ofstream file(m.path);
    file << out.dump();
    TANDEM_CHECK(file.good(), "profile: cannot write the trace '{}'", m.path);
  }
  std::remove(all.c_str());
}

}  // namespace profiler_detail

ProfileSession::ProfileSession(std::shared_ptr<ProcessGroup> group, const ProfileOptions& options,
                               bool cuda)
    : group_(std::move(group)) {
  TANDEM_CHECK_ARG(!options.output_trace_dir.empty(),
                   "Accelerator::profile: [rank {}] ProfileOptions::output_trace_dir is empty; "
                   "name the directory the traces go to",
                   group_->rank());
  fs::create_directories(options.output_trace_dir);
  path_ = options.output_trace_dir + "/profile_" + std::to_string(group_->rank()) + ".json";
  {
    auto& r = profiler_detail::recording();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.active == 0) {
      TANDEM_CHECK_ARG(!r.on, "Accelerator::profile: a recording is still being written");
      compat::ProfilerSettings settings;
      settings.cuda = cuda;
      settings.record_shapes = options.record_shapes;
      settings.profile_memory = options.profile_memory;
      settings.with_stack = options.with_stack;
      settings.with_flops = options.with_flops;
      compat::start_profiler(settings);
      r.on = true;
      r.starter = profiler_detail::this_thread_id();
      r.members.clear();
    }
    ++r.active;
    r.members.push_back({profiler_detail::this_thread_id(), path_});
  }
  active_ = true;
  // Every rank of the process has joined before any records its step.
  group_->barrier();
}

ProfileSession::ProfileSession(ProfileSession&& other) noexcept
    : group_(std::move(other.group_)), path_(std::move(other.path_)), active_(other.active_) {
  other.active_ = false;
}

ProfileSession::~ProfileSession() {
  if (!active_) return;
  if (std::uncaught_exceptions() > 0) {
    leave(/*write=*/false);
    return;
  }
  try {
    stop();
  } catch (...) {
    // A destructor must not throw; stop() explicitly to see the error.
  }
}

void ProfileSession::stop() {
  if (!active_) return;
  group_->barrier();  // every rank's profiled work is done
  leave(/*write=*/true);
}

void ProfileSession::leave(bool write) {
  active_ = false;
  auto& r = profiler_detail::recording();
  std::unique_lock<std::mutex> lock(r.mutex);
  const int64_t generation = r.generation;
  --r.active;
  if (r.starter != profiler_detail::this_thread_id()) {
    // The thread that turned the profiler on turns it off (its state may be
    // that thread's): wake it, and wait for the files.
    r.changed.notify_all();
    r.changed.wait(lock, [&] { return r.generation != generation; });
  } else {
    r.changed.wait(lock, [&] { return r.active == 0; });
    r.error.clear();
    try {
      if (!write) {
        compat::drop_profiler();
      } else if (r.members.size() == 1) {
        compat::stop_profiler(r.members.front().path);
      } else {
        const std::string all = path_ + ".process";
        compat::stop_profiler(all);
        profiler_detail::split_trace(all, r.members);
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    r.on = false;
    ++r.generation;
    r.changed.notify_all();
  }
  if (write && !r.error.empty()) {
    TANDEM_THROW(Error, "Accelerator::profile: [rank {}] writing the traces failed: {}",
                 group_->rank(), r.error);
  }
}

ProfileSession Accelerator::profile(const ProfileOptions& options) {
  return ProfileSession(process_group(), options, device().is_cuda());
}

}  // namespace tandem
