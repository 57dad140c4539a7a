// Accelerator's collective helpers: barriers, ordered execution, gather,
// reduce and padding across ranks, and the unwrapped state dict.

#include <algorithm>
#include <unordered_map>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "tandem/accelerate/accelerator.h"

#include "accelerate/accelerator_impl.h"
#include "accelerate/model_strategy.h"
#include "accelerate/step_controller.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

// Every rank's size of `tensor` along `dim`.
std::vector<int64_t> sizes_across(ProcessGroup& pg, const at::Tensor& tensor, int64_t dim) {
  at::Tensor mine = at::full({1}, tensor.size(dim), at::kLong);
  std::vector<at::Tensor> all = pg.all_gather(mine);
  std::vector<int64_t> sizes;
  sizes.reserve(all.size());
  for (const auto& t : all) sizes.push_back(t.item<int64_t>());
  return sizes;
}

}  // namespace

void Accelerator::wait_for_everyone() { impl_->group->barrier(); }

namespace {

// One barrier: the others wait at it before their turn, `first` reaches it
// only after its own. If `first`'s turn throws, it still reaches the barrier
// (so nobody waits out the timeout) and then rethrows.
void run_first(bool first, Accelerator& accelerator, const std::function<void()>& fn) {
  if (!first) {
    accelerator.wait_for_everyone();
    fn();
    return;
  }
  try {
    fn();
  } catch (...) {
    accelerator.wait_for_everyone();
    throw;
  }
  accelerator.wait_for_everyone();
}

}  // namespace

void Accelerator::main_process_first(const std::function<void()>& fn) {
  run_first(is_main_process(), *this, fn);
}

void Accelerator::local_main_process_first(const std::function<void()>& fn) {
  run_first(is_local_main_process(), *this, fn);
}

at::Tensor Accelerator::pad_across_processes(const at::Tensor& tensor, int64_t dim,
                                             double pad_index, bool pad_first) {
  TANDEM_CHECK_ARG(tensor.defined() && tensor.dim() > 0,
                   "pad_across_processes: needs a tensor with at least one dimension");
  dim = dim < 0 ? dim + tensor.dim() : dim;
  TANDEM_CHECK_ARG(dim >= 0 && dim < tensor.dim(),
                   "pad_across_processes: dim {} is out of range for a {}-d tensor", dim,
                   tensor.dim());
  if (num_processes() == 1) return tensor;
  const auto sizes = sizes_across(*impl_->group, tensor, dim);
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  const int64_t mine = tensor.size(dim);
  if (mine == longest) return tensor;
  auto shape = tensor.sizes().vec();
  shape[static_cast<size_t>(dim)] = longest;
  at::Tensor padded = at::full(shape, pad_index, tensor.options());
  padded.narrow(dim, pad_first ? longest - mine : 0, mine).copy_(tensor);
  return padded;
}

at::Tensor Accelerator::gather(const at::Tensor& tensor) {
  TANDEM_CHECK_ARG(tensor.defined(), "gather: the tensor is undefined");
  torch::NoGradGuard no_grad;
  if (tensor.dim() == 0) return at::stack(impl_->group->all_gather(tensor.contiguous()));
  if (num_processes() == 1) return tensor.clone();
  const auto sizes = sizes_across(*impl_->group, tensor, 0);
  const bool uneven = std::adjacent_find(sizes.begin(), sizes.end(), std::not_equal_to<>()) !=
                      sizes.end();
  at::Tensor mine = uneven ? pad_across_processes(tensor, 0) : tensor;
  auto parts = impl_->group->all_gather(mine.contiguous());
  if (uneven) {
    for (size_t r = 0; r < parts.size(); ++r) parts[r] = parts[r].narrow(0, 0, sizes[r]);
  }
  return at::cat(parts);
}

at::Tensor Accelerator::gather_for_metrics(const at::Tensor& tensor) {
  TANDEM_CHECK_ARG(tensor.defined() && tensor.dim() > 0,
                   "gather_for_metrics: needs per-sample rows in dim 0");
  torch::NoGradGuard no_grad;
  const auto sizes = sizes_across(*impl_->group, tensor, 0);
  // Rows are the current batch's samples when the row count matches it on
  // this rank; every rank sees the same loader state, so all agree.
  const detail::BatchReport& batch = impl_->prepared.controller()->batch();
  const bool from_batch = !batch.real_rows_per_rank.empty() &&
                          static_cast<int>(batch.real_rows_per_rank.size()) == num_processes() &&
                          tensor.size(0) == batch.rows;
  at::Tensor mine = pad_across_processes(tensor, 0);
  auto parts = num_processes() == 1 ? std::vector<at::Tensor>{mine}
                                    : impl_->group->all_gather(mine.contiguous());
  // In a joined pass a shadow rank's outputs are repeats of its last batch:
  // every rank knows which ranks those are, so all drop the same rows.
  const bool joined = static_cast<int>(batch.shadow_ranks.size()) == num_processes();
  for (size_t r = 0; r < parts.size(); ++r) {
    int64_t keep = sizes[r];
    if (from_batch) keep = std::min(keep, batch.real_rows_per_rank[r]);
    if (joined && batch.shadow_ranks[r] != 0) keep = 0;
    parts[r] = parts[r].narrow(0, 0, keep);
  }
  return at::cat(parts);
}

at::Tensor Accelerator::reduce(const at::Tensor& tensor, ReduceOp op) {
  TANDEM_CHECK_ARG(tensor.defined(), "reduce: the tensor is undefined");
  torch::NoGradGuard no_grad;
  at::Tensor result = tensor.clone();
  impl_->group->all_reduce(result, op);
  return result;
}

std::vector<std::pair<std::string, at::Tensor>> Accelerator::get_state_dict() const {
  TANDEM_CHECK_ARG(!impl_->prepared.models().empty(), "get_state_dict: prepare a model first");
  return get_state_dict(impl_->prepared.models().front().module);
}

std::vector<std::pair<std::string, at::Tensor>> Accelerator::get_state_dict(
    const std::shared_ptr<torch::nn::Module>& model) const {
  const std::size_t index = impl_->index_of(model, "get_state_dict");
  torch::NoGradGuard no_grad;
  // A partitioned parameter (ZeRO-3) holds only this rank's shard between
  // uses: read its whole value while the strategy holds it gathered.
  std::unordered_map<const void*, at::Tensor> whole;
  detail::ModelStrategy& strategy = *impl_->prepared.models()[index].strategy;
  if (detail::PartitionedParameters* partitioned = strategy.partitioned()) {
    partitioned->for_each_partitioned_whole([&](const std::string&, const at::Tensor& p) {
      whole.emplace(p.unsafeGetTensorImpl(),
                    p.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
    });
  }
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    auto it = whole.find(item.value().unsafeGetTensorImpl());
    state.emplace_back(item.key(), it != whole.end() ? it->second.clone()
                                                     : item.value().detach().cpu().clone());
  }
  for (const auto& item : model->named_buffers(/*recurse=*/true)) {
    state.emplace_back(item.key(), item.value().detach().cpu().clone());
  }
  return state;
}

}  // namespace tandem
