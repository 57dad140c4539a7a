#pragma once
// The gradient reducer behind DistributedDataParallel: flat buckets whose
// views are the parameters' .grad, autograd hooks that start each bucket's
// communication hook as soon as the bucket is complete, and an
// end-of-backward callback that runs the hooks to the end, handles unused
// parameters and rebuilds the buckets once.
//
// Collective order: hooks start in bucket order during backward; at the end
// of backward the buckets left are started, then (when searching for unused
// parameters) the used-parameter all-reduce, then the hooks' later steps in
// rounds over the buckets in bucket order. Every rank issues the same
// sequence whatever order its gradients arrive in.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/torch_internals.h"
#include "parallel/grad_readiness.h"
#include "parallel/static_graph.h"
#include "tandem/comm/process_group.h"
#include "tandem/parallel/comm_hook.h"
#include "tandem/parallel/ddp.h"

namespace tandem::detail {

class Reducer {
 public:
  // `params` must require grad; `after_sync` runs at the end of every
  // synchronised backward (buffer broadcast). The hook is the built-in one
  // DDPOptions::comm_hook names until register_hook().
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, ProcessGroup& pg,
          const DDPOptions& options, std::function<void()> after_sync);

  void set_sync_enabled(bool enabled);
  bool sync_enabled() const;
  std::vector<std::vector<std::string>> bucket_names() const;
  bool rebuilt() const { return rebuilt_; }
  // DistributedDataParallel::set_bucket_layout(); between backwards.
  void adopt_layout(const std::vector<std::vector<std::string>>& names);
  std::int64_t sync_count() const { return sync_count_; }
  // DistributedDataParallel::communication_wait_seconds(): measured only
  // while on.
  void set_wait_timing(bool enabled);
  double wait_seconds() const;

  // Replaces the built-in average; once, before the first synchronised
  // backward. Throws UsageError otherwise.
  void register_hook(std::shared_ptr<CommHook> hook);
  CommHook& hook() const { return *hook_; }

  // Called by the autograd hook each time `index`'s gradient is accumulated.
  void on_grad_ready(std::size_t index);

 private:
  struct Bucket {
    at::Tensor flat;
    std::vector<std::size_t> members;
    std::optional<GradBucket> view;  // what the hook sees
    HookWork work;
  };

  void build_buckets(const std::vector<std::vector<std::size_t>>& assignment);
  at::Tensor grad_view(std::size_t index) const;
  void adopt_grad(std::size_t index);
  void start_backward();
  void on_static_graph_firing(std::size_t index);
  void arrive(std::size_t index);
  void finalize_backward();
  void launch_ready_buckets();
  void finish_launched();
  void abandon_launched();
  // After a synchronised backward that searched for unused parameters: a
  // parameter no rank used whose .grad holds nothing but zeros gets none.
  void drop_gradients_nobody_made(const std::vector<bool>& used_somewhere);
  void rebuild_from_ready_order();
  [[noreturn]] void throw_unused(const std::vector<std::size_t>& unused);
  [[noreturn]] void throw_fired_again();
  [[noreturn]] void throw_graph_changed(const std::vector<std::string>& changes);

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroup& pg_;
  DDPOptions options_;
  std::function<void()> after_sync_;
  std::shared_ptr<CommHook> hook_;
  bool hook_registered_ = false;

  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<std::int64_t> offset_of_;
  std::vector<internals::GradHook> grad_hooks_;  // removed when the reducer goes

  mutable std::mutex mutex_;
  bool sync_enabled_ = true;
  GradReadiness readiness_;
  StaticGraph static_graph_;
  // Parameters a backward under no_sync reached since the last synchronised
  // one: they count as used there (PyTorch's local_used_map spans no_sync
  // iterations the same way), so their kept gradients are averaged.
  std::vector<bool> used_unsynced_;
  std::vector<std::size_t> fired_again_;  // this backward, without static_graph
  std::vector<std::size_t> ready_order_;
  bool rebuilt_ = false;
  std::int64_t sync_count_ = 0;
  bool time_waits_ = false;
  double wait_seconds_ = 0;
};

}  // namespace tandem::detail
