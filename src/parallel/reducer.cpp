#include "parallel/reducer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "parallel/bucket_assignment.h"
#include "parallel/flat_grad.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "tandem/parallel/powersgd_hook.h"

namespace tandem::detail {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

std::shared_ptr<CommHook> make_builtin_hook(const DDPOptions& options) {
  switch (options.comm_hook) {
    case CommHook::kAverage: return std::make_shared<AllReduceHook>();
    case CommHook::kFp16Compress: return std::make_shared<CompressHook>(at::kHalf);
    case CommHook::kBf16Compress: return std::make_shared<CompressHook>(at::kBFloat16);
    case CommHook::kPowerSGD: return std::make_shared<PowerSGDHook>(options.powersgd);
  }
  TANDEM_THROW(UsageError, "DDPOptions::comm_hook has no built-in hook numbered {}",
               static_cast<int>(options.comm_hook));
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, ProcessGroup& pg,
                 const DDPOptions& options, std::function<void()> after_sync)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(pg),
      options_(options),
      after_sync_(std::move(after_sync)),
      hook_(make_builtin_hook(options)),
      static_graph_(params_.size()),
      used_unsynced_(params_.size(), false) {
  TANDEM_CHECK_ARG(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
                   "DDP bucket caps must be positive, got bucket_cap_mb={} first_bucket_cap_mb={}",
                   options_.bucket_cap_mb, options_.first_bucket_cap_mb);
  // Backward produces gradients roughly in reverse registration order.
  build_buckets(assign_buckets(params_, reverse_order(params_.size()),
                               static_cast<std::int64_t>(options_.first_bucket_cap_mb * kMiB),
                               static_cast<std::int64_t>(options_.bucket_cap_mb * kMiB)));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    grad_hooks_.push_back(
        internals::add_grad_ready_hook(params_[i], [this, i] { on_grad_ready(i); }));
  }
}

void Reducer::set_sync_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_enabled_ = enabled;
}

bool Reducer::sync_enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_enabled_;
}

void Reducer::register_hook(std::shared_ptr<CommHook> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK_ARG(hook != nullptr,
                   "DistributedDataParallel::register_comm_hook: the hook is null");
  TANDEM_CHECK_ARG(!hook_registered_,
                   "DistributedDataParallel::register_comm_hook: a hook ('{}') is registered "
                   "already; register one hook per wrapper (as in PyTorch)",
                   hook_->name());
  TANDEM_CHECK_ARG(options_.comm_hook == CommHook::kAverage,
                   "DistributedDataParallel::register_comm_hook: DDPOptions::comm_hook chose the "
                   "built-in '{}' hook; leave it at kAverage (ddp.comm_hook: none) to register "
                   "'{}'",
                   hook_->name(), hook->name());
  TANDEM_CHECK_ARG(sync_count_ == 0 && !readiness_.in_backward(),
                   "DistributedDataParallel::register_comm_hook: called after {} synchronised "
                   "backward pass(es); register the hook right after wrapping the model, before "
                   "the first backward",
                   sync_count_);
  hook_ = std::move(hook);
  hook_registered_ = true;
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (std::size_t i : bucket.members) out.back().push_back(names_[i]);
  }
  return out;
}

void Reducer::adopt_layout(const std::vector<std::vector<std::string>>& names) {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK_ARG(!readiness_.in_backward(),
                   "DistributedDataParallel::set_bucket_layout: called during backward; call "
                   "it between backward passes");
  std::map<std::string, std::size_t> index_of;
  for (std::size_t i = 0; i < names_.size(); ++i) index_of.emplace(names_[i], i);
  std::vector<std::vector<std::size_t>> assignment;
  std::vector<bool> placed(params_.size(), false);
  for (const auto& bucket : names) {
    TANDEM_CHECK_ARG(!bucket.empty(),
                     "DistributedDataParallel::set_bucket_layout: bucket {} is empty; pass "
                     "what bucket_parameter_names() returned",
                     assignment.size());
    assignment.emplace_back();
    for (const auto& name : bucket) {
      const auto it = index_of.find(name);
      TANDEM_CHECK_ARG(it != index_of.end() && !placed[it->second],
                       "DistributedDataParallel::set_bucket_layout: '{}' is {}; the layout must "
                       "name each trainable parameter of the wrapped module once, as "
                       "bucket_parameter_names() of the same model returns them",
                       name,
                       it == index_of.end() ? "not a trainable parameter here" : "named twice");
      const at::Tensor& first = params_[index_of.at(bucket.front())];
      const at::Tensor& p = params_[it->second];
      TANDEM_CHECK_ARG(p.scalar_type() == first.scalar_type() && p.device() == first.device(),
                       "DistributedDataParallel::set_bucket_layout: '{}' ({}, {}) and '{}' ({}, "
                       "{}) cannot share a bucket: a bucket holds one dtype on one device",
                       name, c10::toString(p.scalar_type()), p.device().str(), bucket.front(),
                       c10::toString(first.scalar_type()), first.device().str());
      placed[it->second] = true;
      assignment.back().push_back(it->second);
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    TANDEM_CHECK_ARG(placed[i],
                     "DistributedDataParallel::set_bucket_layout: trainable parameter '{}' is in "
                     "no bucket; pass what bucket_parameter_names() of the same model returned",
                     names_[i]);
  }
  build_buckets(assignment);
  // As after the rebuild: the layout stays.
  rebuilt_ = true;
  ready_order_.clear();
}

void Reducer::build_buckets(const std::vector<std::vector<std::size_t>>& assignment) {
  std::vector<Bucket> buckets;
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  for (const auto& members : assignment) {
    Bucket bucket;
    bucket.members = members;
    std::int64_t total = 0;
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    for (std::size_t i : members) {
      bucket_of_[i] = buckets.size();
      offset_of_[i] = total;
      total += params_[i].numel();
      params.push_back(params_[i]);
      names.push_back(names_[i]);
    }
    const at::Tensor& first = params_[members.front()];
    bucket.flat = at::zeros({total}, first.options().requires_grad(false));
    bucket.view.emplace(buckets.size(), assignment.size(), bucket.flat, std::move(params),
                        std::move(names), pg_);
    buckets.push_back(std::move(bucket));
  }
  // Gradients computed so far (after a rebuild: already reduced) move into
  // the new layout; from now on .grad is a view of the bucket.
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    if (!grad.defined()) continue;
    const Bucket& bucket = buckets[bucket_of_[i]];
    at::Tensor view = internals::flat_alias(bucket.flat, offset_of_[i], params_[i].sizes());
    view.copy_(grad);
    grad = view;
  }
  buckets_ = std::move(buckets);
  readiness_.reset(bucket_of_, buckets_.size());
}

at::Tensor Reducer::grad_view(std::size_t index) const {
  return internals::flat_alias(buckets_[bucket_of_[index]].flat, offset_of_[index],
                               params_[index].sizes());
}

void Reducer::adopt_grad(std::size_t index) {
  adopt_into(params_[index].mutable_grad(), grad_view(index));
}

void Reducer::on_grad_ready(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_enabled_) {
    used_unsynced_[index] = true;
    return;
  }
  if (readiness_.start_if_idle()) {
    // Not Engine::queue_callback: inside a checkpointed block's nested
    // backward that would finalize when the block's backward ends, not the
    // model's.
    queue_end_of_backward([this] { finalize_backward(); });
    start_backward();
  }
  if (options_.static_graph) {
    on_static_graph_firing(index);
    return;
  }
  if (!readiness_.mark_ready(index)) {
    // A reentrant backward accumulated into a gradient whose bucket may be
    // on the wire already.
    fired_again_.push_back(index);
    return;
  }
  adopt_grad(index);
  if (!rebuilt_) ready_order_.push_back(index);
  arrive(index);
}

void Reducer::start_backward() {
  fired_again_.clear();
  if (!options_.static_graph) return;
  static_graph_.start_backward();
  if (!static_graph_.recorded()) return;
  // What this rank never uses is ready, as zeros, from the start.
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!static_graph_.unused_here(i)) continue;
    grad_view(i).zero_();
    readiness_.mark_ready(i);
    arrive(i);
  }
}

void Reducer::on_static_graph_firing(std::size_t index) {
  switch (static_graph_.fire(index)) {
    case StaticGraph::Firing::kFirst:
      // The first backward reduces everything at its end, once it knows how
      // many gradients each parameter gets.
      adopt_grad(index);
      if (!rebuilt_) ready_order_.push_back(index);
      return;
    case StaticGraph::Firing::kComplete:
      readiness_.mark_ready(index);
      adopt_grad(index);
      arrive(index);
      return;
    case StaticGraph::Firing::kAgain:
    case StaticGraph::Firing::kPending:
    case StaticGraph::Firing::kUnexpected:  // reported at the end of backward
      return;
  }
}

void Reducer::arrive(std::size_t index) {
  if (readiness_.arrive(index)) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // A launch can block: the first collectives (and all under
  // TANDEM_DEBUG=DETAIL) check that every rank issues the same one.
  std::chrono::steady_clock::time_point launching;
  if (time_waits_) launching = std::chrono::steady_clock::now();
  readiness_.launch_ready([this](std::size_t b) {
    Bucket& bucket = buckets_[b];
    // Named for traces (Accelerator::profile); costs nothing unprofiled.
    RECORD_USER_SCOPE("tandem::bucket " + std::to_string(b));
    bucket.work = hook_->start(*bucket.view);
  });
  if (time_waits_) {
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - launching).count();
  }
}

void Reducer::finish_launched() {
  // In rounds, each advancing every unfinished bucket one step in bucket
  // order: hooks issue their later collectives in the same sequence on
  // every rank, and one bucket's step overlaps the others' collectives.
  for (bool pending = true; pending;) {
    pending = false;
    for (std::size_t b = 0; b < readiness_.launched(); ++b) {
      HookWork& work = buckets_[b].work;
      RECORD_USER_SCOPE("tandem::bucket " + std::to_string(b) + " wait");
      work.advance();
      pending = pending || !work.done();
    }
  }
}

void Reducer::abandon_launched() {
  // On the way to an error: let the collectives in flight finish (dropping
  // a HookWork waits for its Work), without starting any more.
  for (std::size_t b = 0; b < readiness_.launched(); ++b) {
    HookWork dropped(std::move(buckets_[b].work));
  }
}

void Reducer::throw_unused(const std::vector<std::size_t>& unused) {
  std::string list;
  for (std::size_t k = 0; k < unused.size() && k < 10; ++k) {
    list += (k ? ", " : "") + names_[unused[k]];
  }
  if (unused.size() > 10) list += fmt::format(", ... ({} more)", unused.size() - 10);
  TANDEM_THROW(UsageError,
               "DistributedDataParallel: {} parameter(s) received no gradient in this backward: {}. "
               "Their gradients cannot be averaged, so ranks would diverge. Fix one of: "
               "(1) use these parameters in forward (or in the loss) on every step; "
               "(2) freeze them with requires_grad_(false) before wrapping; "
               "(3) set DDPOptions::find_unused_parameters = true (costs a little per step); "
               "(4) if the same parameters are unused in every step, set "
               "DDPOptions::static_graph = true",
               unused.size(), list);
}

void Reducer::throw_fired_again() {
  std::string list;
  for (std::size_t k = 0; k < fired_again_.size() && k < 10; ++k) {
    list += (k ? ", " : "") + names_[fired_again_[k]];
  }
  TANDEM_THROW(UsageError,
               "DistributedDataParallel: parameter(s) {} received a gradient more than once in "
               "one backward, after DDP had counted them ready; their bucket may have been "
               "averaged without the later gradients. This happens with reentrant backward "
               "passes, e.g. a block run through tandem::checkpoint twice in one forward. Fix "
               "one of: (1) set DDPOptions::static_graph = true (ddp.static_graph in tandem "
               "YAML) when every iteration uses the same parameters the same number of times: "
               "DDP then waits for every gradient; (2) call the checkpointed block once per "
               "forward",
               list);
}

void Reducer::throw_graph_changed(const std::vector<std::string>& changes) {
  std::string list;
  for (std::size_t k = 0; k < changes.size() && k < 10; ++k) list += (k ? ", " : "") + changes[k];
  if (changes.size() > 10) list += fmt::format(", ... ({} more)", changes.size() - 10);
  TANDEM_THROW(UsageError,
               "DistributedDataParallel: static_graph is set, but this backward (synchronised "
               "backward #{}) differs from the first: {}. static_graph promises that every "
               "iteration gives the same parameters the same number of gradients, and DDP relies "
               "on it to know when a bucket is complete. Fix one of: (1) set "
               "DDPOptions::static_graph = false, with find_unused_parameters = true if some "
               "parameters are used only in some iterations; (2) make forward use the same "
               "parameters in every iteration",
               sync_count_ + 1, list);
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  readiness_.finish();  // the next gradient starts the next backward
  if (!fired_again_.empty()) {
    abandon_launched();
    throw_fired_again();
  }
  const bool first_static = options_.static_graph && !static_graph_.recorded();
  if (options_.static_graph && static_graph_.recorded()) {
    const std::vector<std::string> changes = static_graph_.changes(names_);
    if (!changes.empty()) {
      abandon_launched();
      throw_graph_changed(changes);
    }
  }
  // This rank's parameters without a gradient: they contribute zeros.
  std::vector<std::size_t> unused;
  if (first_static) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (static_graph_.fired(i)) {
        readiness_.mark_ready(i);
        readiness_.arrive(i);
      } else {
        unused.push_back(i);
      }
    }
  } else {
    unused = readiness_.unready();
  }
  if (!unused.empty() && !options_.find_unused_parameters && !options_.static_graph) {
    abandon_launched();
    throw_unused(unused);
  }
  // What this backward did not reach contributes the gradient the parameter
  // holds (from micro-steps under no_sync, say), as PyTorch's reducer copies
  // a defined .grad into the bucket, or else zeros. .grad itself is left as
  // it is until the average is known.
  for (std::size_t i : unused) {
    copy_into_slot(params_[i].grad(), grad_view(i));
    readiness_.arrive(i);
  }
  // Which parameters some rank used: only those get a (reduced) gradient.
  // With static_graph the first backward finds out for all that follow.
  const bool search = first_static || (options_.find_unused_parameters && !options_.static_graph);
  at::Tensor used_flags;
  if (search) {
    used_flags = at::zeros({static_cast<std::int64_t>(params_.size())}, at::kInt);
    auto* used = used_flags.data_ptr<int>();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      used[i] = readiness_.ready(i) || used_unsynced_[i] ? 1 : 0;
    }
  }
  // Buckets first: some ranks launched them during backward already, and
  // every rank must issue its collectives in the same order.
  launch_ready_buckets();
  std::chrono::steady_clock::time_point waiting;
  if (time_waits_) waiting = std::chrono::steady_clock::now();
  Work used_work;
  if (search) used_work = pg_.all_reduce_async(used_flags, ReduceOp::kMax);
  finish_launched();
  used_work.wait();
  std::vector<bool> used_somewhere(params_.size(), true);
  if (search) {
    const auto* used = used_flags.data_ptr<int>();
    for (std::size_t i = 0; i < params_.size(); ++i) used_somewhere[i] = used[i] != 0;
  } else if (options_.static_graph) {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      used_somewhere[i] = !static_graph_.unused_everywhere(i);
      if (static_graph_.unused_here(i)) unused.push_back(i);
    }
  }
  if (first_static) static_graph_.record(used_somewhere);
  used_unsynced_.assign(params_.size(), false);
  for (std::size_t i : unused) {
    if (used_somewhere[i]) params_[i].mutable_grad() = grad_view(i);
  }
  if (search || options_.static_graph) drop_gradients_nobody_made(used_somewhere);
  ++sync_count_;
  if (!rebuilt_) rebuild_from_ready_order();
  if (after_sync_) after_sync_();
  if (time_waits_) {
    wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting).count();
  }
}

void Reducer::drop_gradients_nobody_made(const std::vector<bool>& used_somewhere) {
  // PyTorch's reducer leaves a parameter no rank used without a gradient
  // when zero_grad() set it to None, and the optimizer then skips it (no
  // momentum, no weight decay), as one process would. tandem's zero_grad
  // zeroes the bucket views in place instead, so a view that is still all
  // zeros here stands for None; one holding a gradient the user kept (no
  // zero_grad) stays, as PyTorch keeps it. One sync for all of them.
  std::vector<std::size_t> candidates;
  std::vector<at::Tensor> grads;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (used_somewhere[i] || !params_[i].grad().defined()) continue;
    candidates.push_back(i);
    grads.push_back(params_[i].grad());
  }
  if (candidates.empty()) return;
  torch::NoGradGuard no_grad;
  const at::Tensor zero = at::stack(at::_foreach_norm(grads)).eq(0).cpu();
  const auto* is_zero = zero.data_ptr<bool>();
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    if (is_zero[k]) params_[candidates[k]].mutable_grad() = at::Tensor();
  }
}

void Reducer::set_wait_timing(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  time_waits_ = enabled;
}

double Reducer::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return wait_seconds_;
}

void Reducer::rebuild_from_ready_order() {
  rebuilt_ = true;
  // Ranks may see different arrival orders; rank 0's decides for everyone.
  std::vector<std::size_t> order = ready_order_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (std::find(order.begin(), order.end(), i) == order.end()) order.push_back(i);
  }
  at::Tensor wire = at::empty({static_cast<std::int64_t>(order.size())}, at::kLong);
  auto* slots = wire.data_ptr<std::int64_t>();
  for (std::size_t k = 0; k < order.size(); ++k) slots[k] = static_cast<std::int64_t>(order[k]);
  pg_.broadcast(wire, 0);
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<std::size_t>(slots[k]);
  build_buckets(assign_buckets(params_, order,
                               static_cast<std::int64_t>(options_.first_bucket_cap_mb * kMiB),
                               static_cast<std::int64_t>(options_.bucket_cap_mb * kMiB)));
  ready_order_.clear();
  log_debug("DDP rebuilt {} bucket(s) from the gradient arrival order", buckets_.size());
}

}  // namespace tandem::detail
