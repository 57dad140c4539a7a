#pragma once
// DistributedDataParallel for LibTorch modules.
//
// Wrap a module once; keep calling module->forward(...) and loss.backward()
// exactly as in a single-process loop. By the time backward() returns, every
// parameter's .grad holds the average over all ranks.
//
//   auto pg = tandem::ProcessGroup::init(tandem::RankEnv::from_environment());
//   auto model = MyNet();
//   tandem::DistributedDataParallel ddp(model, pg);
//   ... model->forward(x) ... loss.backward() ... optimizer.step()
//
// How: gradients live in flat per-bucket buffers and each parameter's .grad is
// a view into its bucket (no copy). An autograd hook marks a parameter ready
// when its gradient is accumulated; when a bucket is complete its
// communication hook (tandem/parallel/comm_hook.h: by default one all-reduce
// of the average) starts at once, overlapping the rest of backward. Buckets
// start in reverse
// parameter order (first one 1 MB, then 25 MB) and are rebuilt once, after
// the first backward, in the order gradients actually arrived (rank 0's).
// Buffers (e.g. BatchNorm running statistics) are copied from rank 0 at
// construction and after every synchronised backward, so each forward starts
// from rank 0's buffers as in PyTorch, unless a rank changes a buffer
// between a backward and the next forward (docs/architecture.md).
//
// Thread-safety: one training thread per DistributedDataParallel. The wrapper
// holds the module (a shared_ptr), and must outlive any backward through the
// module that should synchronise (the Accelerator's prepared objects keep it
// alive for you).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/comm/process_group.h"
#include "tandem/parallel/comm_hook.h"
#include "tandem/parallel/powersgd_hook.h"

namespace tandem {

struct DDPOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  // Parameters that get no gradient in a backward are an error by default
  // (the message names them). With this set they count as ready instead.
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  // What is sent across ranks for each bucket: a built-in hook (see
  // CommHook::Builtin), built for this wrapper alone. For a hook of your
  // own, leave kAverage and call register_comm_hook().
  CommHook::Builtin comm_hook = CommHook::kAverage;
  // PowerSGD's hyperparameters, used when comm_hook is kPowerSGD.
  PowerSGDOptions powersgd;
  // PyTorch's static_graph: the promise that every iteration uses the same
  // parameters, each the same number of times. The first synchronised
  // backward then reduces all buckets at its end (no overlap, once) and
  // records which parameters each rank uses and how often their gradient
  // hooks fire; later backwards mark the unused ones ready at once (no
  // error, and no per-step search even with find_unused_parameters) and
  // count a parameter ready only after all its firings, which makes
  // reentrant backward passes (a block checkpointed twice in one forward)
  // correct. A backward that breaks the promise throws UsageError naming
  // the parameters.
  bool static_graph = false;
  // Opt-in: make tandem's caching CPU allocator LibTorch's CPU allocator for
  // the whole process, for good (tandem/core/cpu_allocator.h): large blocks
  // are reused instead of page-faulted back in every step. It caches up to a
  // quarter of RAM and takes one mutex per large free. Worth it without
  // tuned malloc thresholds (docs/performance.md: ZeRO steps 11-14% faster);
  // no effect with them. Config: `ddp.cache_cpu_allocations: true`.
  bool cache_cpu_allocations = false;
};

namespace detail {
class Reducer;
}

class DistributedDataParallel {
 public:
  // Broadcasts `module`'s parameters and buffers from rank 0, checks that
  // every rank has the same parameter names, shapes and dtypes (the error
  // names the rank and the first difference), and installs the hooks.
  // Collective: every rank must construct its wrapper in the same order.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<ProcessGroup> process_group, DDPOptions options = {});

  template <typename ModuleImpl>
  DistributedDataParallel(const torch::nn::ModuleHolder<ModuleImpl>& module,
                          std::shared_ptr<ProcessGroup> process_group, DDPOptions options = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                                std::move(process_group), options) {}

  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Gradient accumulation: while a NoSync lives, backward() communicates
  // nothing and gradients accumulate locally; the first backward after it
  // reduces everything accumulated. Not nestable across wrappers' threads.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // The switch behind NoSync, for owners that decide per micro-step (the
  // Accelerator): false makes the next backward() communicate nothing. Must
  // not change during a backward.
  void set_gradient_sync(bool enabled);
  bool gradient_sync() const;

  // Replaces the built-in average with `hook` for every later backward
  // (PyTorch's register_comm_hook). Call once, after construction and
  // before the first synchronised backward, with DDPOptions::comm_hook left
  // at kAverage; otherwise throws UsageError. Every rank must register an
  // equivalent hook. The wrapper shares ownership of the hook.
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  // The same for a hook written as a function (wrapped in a FunctionHook).
  void register_comm_hook(std::function<HookWork(GradBucket&)> hook,
                          std::string name = "function");
  // The hook in use (the built-in one until register_comm_hook()), e.g. to
  // read a PowerSGDHook's statistics.
  CommHook& comm_hook() const;

  // Copies the buffer source's buffers (rank 0's unless set below) to every
  // rank (collective). Called for you at construction and after each
  // synchronised backward when broadcast_buffers.
  void sync_buffers();
  // The rank whose buffers sync_buffers() copies: in a joined pass the
  // Accelerator names the highest rank that still has data, as PyTorch's
  // Join takes its authoritative rank, so that ranks repeating a stand-in
  // batch do not overwrite everyone's BatchNorm statistics.
  void set_buffer_source(int rank);

  int buffer_source() const { return buffer_source_; }

  torch::nn::Module& module() const { return *module_; }
  std::shared_ptr<torch::nn::Module> module_ptr() const { return module_; }
  ProcessGroup& process_group() const { return *process_group_; }
  const DDPOptions& options() const { return options_; }

  // Introspection and test seams.
  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  bool buckets_rebuilt() const;
  // Rebuilds the buckets as `names` (parameter names per bucket, in launch
  // order: what bucket_parameter_names() returned, possibly in another
  // process) and keeps them, as if rebuilt from gradient arrival order. A
  // resumed run then has the saved run's buckets from its first backward,
  // which state kept per bucket (PowerSGD's) needs. Gradients already
  // computed move into the new buckets. Call between backwards, on every
  // rank with the same layout. UsageError, with nothing changed, unless
  // `names` holds each trainable parameter once, each bucket of one dtype
  // and device.
  void set_bucket_layout(const std::vector<std::vector<std::string>>& names);
  // Number of synchronised backward passes so far.
  std::int64_t sync_count() const;
  // Seconds synchronised backward passes have spent on communication while
  // timing was on: launching bucket hooks (a launch waits for the other
  // ranks while the first collectives, or all under TANDEM_DEBUG=DETAIL,
  // are checked for desync; a compressing hook's own work counts too), and
  // at the end of backward waiting for them, the unused-parameter search
  // and the buffer broadcast. set_wait_timing(true) turns it on (off: no
  // clock is read). For the Accelerator's wall_clock_breakdown. Call
  // outside backward.
  void set_wait_timing(bool enabled);
  double communication_wait_seconds() const;

 private:
  int buffer_source_ = 0;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> process_group_;
  DDPOptions options_;
  std::unique_ptr<detail::Reducer> reducer_;
};

}  // namespace tandem
