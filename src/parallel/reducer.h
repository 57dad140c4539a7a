#pragma once
// The gradient reducer behind DistributedDataParallel: flat buckets whose
// views are the parameters' .grad, autograd hooks that launch each bucket's
// all-reduce as soon as it is complete, and an end-of-backward callback that
// waits for them, handles unused parameters and rebuilds the buckets once.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/torch_internals.h"
#include "parallel/grad_readiness.h"
#include "tandem/comm/process_group.h"
#include "tandem/parallel/ddp.h"

namespace tandem::detail {

class Reducer {
 public:
  // `params` must require grad; `after_sync` runs at the end of every
  // synchronised backward (buffer broadcast).
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, ProcessGroup& pg,
          const DDPOptions& options, std::function<void()> after_sync);

  void set_sync_enabled(bool enabled);
  bool sync_enabled() const;
  std::vector<std::vector<std::string>> bucket_names() const;
  bool rebuilt() const { return rebuilt_; }
  std::int64_t sync_count() const { return sync_count_; }

  // Called by the autograd hook once `index`'s gradient is accumulated.
  void on_grad_ready(std::size_t index);

 private:
  struct Bucket {
    at::Tensor flat;
    at::Tensor wire;  // compressed copy on the wire, when a compression hook is on
    std::vector<std::size_t> members;
    Work work;
  };

  void build_buckets(const std::vector<std::vector<std::size_t>>& assignment);
  at::Tensor grad_view(std::size_t index) const;
  void adopt_grad(std::size_t index);
  void finalize_backward();
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void wait_launched();
  void rebuild_from_ready_order();
  [[noreturn]] void throw_unused(const std::vector<std::size_t>& unused);

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroup& pg_;
  DDPOptions options_;
  std::function<void()> after_sync_;

  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::int64_t> offset_of_;
  std::vector<internals::GradHook> grad_hooks_;  // removed when the reducer goes

  mutable std::mutex mutex_;
  bool sync_enabled_ = true;
  GradReadiness readiness_;
  std::vector<std::size_t> ready_order_;
  bool rebuilt_ = false;
  std::int64_t sync_count_ = 0;
};

}  // namespace tandem::detail
