#include "parallel/reducer.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "parallel/bucket_assignment.h"
#include "parallel/flat_grad.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem::detail {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names, ProcessGroup& pg,
                 const DDPOptions& options, std::function<void()> after_sync)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(pg),
      options_(options),
      after_sync_(std::move(after_sync)) {
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

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    out.emplace_back();
    for (std::size_t i : bucket.members) out.back().push_back(names_[i]);
  }
  return out;
}

void Reducer::build_buckets(const std::vector<std::vector<std::size_t>>& assignment) {
  std::vector<Bucket> buckets;
  bucket_of_.assign(params_.size(), 0);
  offset_of_.assign(params_.size(), 0);
  for (const auto& members : assignment) {
    Bucket bucket;
    bucket.members = members;
    std::int64_t total = 0;
    for (std::size_t i : members) {
      bucket_of_[i] = buckets.size();
      offset_of_[i] = total;
      total += params_[i].numel();
    }
    const at::Tensor& first = params_[members.front()];
    bucket.flat = at::zeros({total}, first.options().requires_grad(false));
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
  if (!sync_enabled_) return;
  if (readiness_.start_if_idle()) {
    // Not Engine::queue_callback: inside a checkpointed block's nested
    // backward that would finalize when the block's backward ends, not the
    // model's.
    queue_end_of_backward([this] { finalize_backward(); });
  }
  if (!readiness_.mark_ready(index)) return;
  adopt_grad(index);
  if (!rebuilt_) ready_order_.push_back(index);
  if (readiness_.arrive(index)) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  readiness_.launch_ready([this](std::size_t b) { launch(buckets_[b]); });
}

void Reducer::launch(Bucket& bucket) {
  switch (options_.comm_hook) {
    case CommHook::kAverage:
      bucket.work = pg_.all_reduce_async(bucket.flat, ReduceOp::kAvg);
      break;
    case CommHook::kFp16Compress:
    case CommHook::kBf16Compress:
      bucket.wire = bucket.flat.to(options_.comm_hook == CommHook::kFp16Compress ? at::kHalf
                                                                                  : at::kBFloat16);
      bucket.work = pg_.all_reduce_async(bucket.wire, ReduceOp::kAvg);
      break;
  }
}

void Reducer::wait_launched() {
  for (std::size_t b = 0; b < readiness_.launched(); ++b) buckets_[b].work.wait();
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
               "(3) set DDPOptions::find_unused_parameters = true (costs a little per step)",
               unused.size(), list);
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  readiness_.finish();  // the next gradient starts the next backward
  const std::vector<std::size_t> unused = readiness_.unready();
  at::Tensor globally_used;
  if (!unused.empty()) {
    if (!options_.find_unused_parameters) {
      wait_launched();
      throw_unused(unused);
    }
    torch::NoGradGuard no_grad;
    for (std::size_t i : unused) {
      grad_view(i).zero_();  // this rank contributes nothing
      readiness_.arrive(i);
    }
  }
  if (options_.find_unused_parameters) {
    // Which parameters some rank used: only those get a (reduced) gradient.
    globally_used = at::zeros({static_cast<std::int64_t>(params_.size())}, at::kInt);
    auto* used = globally_used.data_ptr<int>();
    for (std::size_t i = 0; i < params_.size(); ++i) used[i] = readiness_.ready(i) ? 1 : 0;
  }
  // Buckets first: some ranks launched them during backward already, and
  // every rank must issue its collectives in the same order.
  launch_ready_buckets();
  Work used_work;
  if (globally_used.defined()) used_work = pg_.all_reduce_async(globally_used, ReduceOp::kMax);
  wait_launched();
  used_work.wait();
  if (options_.comm_hook != CommHook::kAverage) {
    for (auto& bucket : buckets_) bucket.flat.copy_(bucket.wire);
  }
  if (globally_used.defined()) {
    const auto* used = globally_used.data_ptr<int>();
    for (std::size_t i : unused) {
      if (used[i]) params_[i].mutable_grad() = grad_view(i);
    }
  }
  ++sync_count_;
  if (!rebuilt_) rebuild_from_ready_order();
  if (after_sync_) after_sync_();
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
