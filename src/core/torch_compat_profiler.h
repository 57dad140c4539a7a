#pragma once
// LibTorch version differences in the Kineto profiler API (see
// torch_compat.h), for Accelerator::profile(). Private to the library:
// include only from src/.

#include <memory>
#include <set>
#include <string>

#include <torch/csrc/autograd/profiler_kineto.h>

namespace tandem::compat {

struct ProfilerSettings {
  bool cuda = false;
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_stack = false;
  bool with_flops = false;
};

namespace profiler_compat_detail {
// ExperimentalConfig::profile_all_threads (record operators on threads other
// than the one that enabled the profiler) is not in every supported version:
// set it where it exists.
template <typename Config>
auto record_all_threads(Config& config, int) -> decltype(config.profile_all_threads = true, void()) {
  config.profile_all_threads = true;
}
template <typename Config>
void record_all_threads(Config&, long) {}
}  // namespace profiler_compat_detail

// Kineto on, for this process (every thread where the version can).
inline void start_profiler(const ProfilerSettings& s) {
  namespace impl = torch::profiler::impl;
  impl::ExperimentalConfig experimental;
  profiler_compat_detail::record_all_threads(experimental, 0);
  impl::ProfilerConfig config(impl::ProfilerState::KINETO, s.record_shapes, s.profile_memory,
                              s.with_stack, s.with_flops, /*with_modules=*/false, experimental);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (s.cuda) activities.insert(impl::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

// Kineto off; writes the Chrome trace of what it recorded to `path`.
inline void stop_profiler(const std::string& path) {
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  result->save(path);
}

// Kineto off, dropping the recording.
inline void drop_profiler() { (void)torch::autograd::profiler::disableProfiler(); }

}  // namespace tandem::compat
