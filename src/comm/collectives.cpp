// ProcessGroup's collectives: each checked for its arguments, numbered,
// checked against the other ranks' (desync), and handed to the transport the
// group chose for its kind (Impl::routes, transport.h): shared memory (ranks
// on one host), the hierarchical path (ranks on several hosts, some host
// holding several), or c10d (Gloo, NCCL for CUDA tensors). Each transport
// bounds the collective by the timeout.

#include "tandem/comm/process_group.h"

#include <ATen/record_function.h>

#include "comm/comm_error.h"
#include "comm/process_group_impl.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

void check_avg(const at::Tensor& tensor, ReduceOp op, const char* name) {
  TANDEM_CHECK_ARG(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                   "{}: ReduceOp::kAvg needs a floating-point tensor, got {}; use kSum and divide",
                   name, c10::toString(tensor.scalar_type()));
}

// The whole tensor of a gather or scatter (`name`) against this rank's part.
void check_whole(const at::Tensor& whole, const at::Tensor& part, int world, const char* op,
                 const char* name) {
  TANDEM_CHECK_ARG(whole.numel() == part.numel() * world &&
                       whole.scalar_type() == part.scalar_type() &&
                       whole.device() == part.device(),
                   "{}: {} must hold world_size ({}) x {} elements of {} on {}, got {} of {} on {}",
                   op, name, world, part.numel(), c10::toString(part.scalar_type()),
                   part.device().str(), whole.numel(), c10::toString(whole.scalar_type()),
                   whole.device().str());
}

}  // namespace

void detail::check_dense(const at::Tensor& tensor, const char* op, const char* name) {
  TANDEM_CHECK_ARG(tensor.defined(), "{}: {} is an undefined tensor", op, name);
  TANDEM_CHECK_ARG(tensor.is_contiguous() && !tensor.is_sparse(),
                   "{}: {} must be a dense contiguous tensor; call .contiguous() first", op, name);
}

// ---- collectives ------------------------------------------------------------

Work ProcessGroup::all_reduce_async(at::Tensor tensor, ReduceOp op) {
  RECORD_USER_SCOPE("tandem::all_reduce_async");
  impl_->require_member("all_reduce");
  detail::check_dense(tensor, "all_reduce", "the tensor");
  check_avg(tensor, op, "all_reduce");
  if (impl_->is_local()) return Work();
  auto& transport = *impl_->routes.reduce;
  auto call = impl_->begin(detail::CollectiveOp::kAllReduce, &tensor,
                           transport.name(tensor, /*reduces=*/true), static_cast<std::int64_t>(op));
  return transport.all_reduce(tensor, op, call);
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  RECORD_USER_SCOPE("tandem::all_reduce");
  all_reduce_async(tensor, op).wait();
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  RECORD_USER_SCOPE("tandem::broadcast");
  impl_->require_member("broadcast");
  detail::check_dense(tensor, "broadcast", "the tensor");
  TANDEM_CHECK_ARG(root >= 0 && root < impl_->world_size,
                   "broadcast: root {} is not a rank of this world of {}", root, impl_->world_size);
  if (impl_->is_local()) return;
  auto& transport = *impl_->routes.broadcast;
  auto call = impl_->begin(detail::CollectiveOp::kBroadcast, &tensor,
                           transport.name(tensor, /*reduces=*/false), -1, root);
  transport.broadcast(tensor, root, call);
}

// The all-gather proper, for a collective already begun as `call` (also the
// inner gathers of all_gather_bytes, which are numbered and checked once).
std::vector<at::Tensor> ProcessGroup::Impl::gather_tensor(const at::Tensor& tensor,
                                                          const Call& call) {
  // Gloo divides by the element count: empty tensors must not reach it.
  if (tensor.numel() == 0) {
    return std::vector<at::Tensor>(static_cast<size_t>(world_size), tensor.clone());
  }
  std::vector<int64_t> shape{world_size};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  at::Tensor all = at::empty(shape, tensor.options());
  routes.reduce->all_gather(all, tensor.contiguous(), call);
  return all.unbind(0);
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  RECORD_USER_SCOPE("tandem::all_gather");
  impl_->require_member("all_gather");
  detail::check_dense(tensor, "all_gather", "the input");
  if (impl_->is_local()) {
    return std::vector<at::Tensor>(static_cast<size_t>(impl_->world_size), tensor.clone());
  }
  auto call = impl_->begin(detail::CollectiveOp::kAllGather, &tensor,
                           impl_->routes.reduce->name(tensor, /*reduces=*/false));
  return impl_->gather_tensor(tensor, call);
}

void ProcessGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  RECORD_USER_SCOPE("tandem::all_gather_into");
  impl_->require_member("all_gather_into");
  detail::check_dense(input, "all_gather_into", "the input");
  detail::check_dense(output, "all_gather_into", "the output");
  const int64_t n = input.numel();
  check_whole(output, input, impl_->world_size, "all_gather_into", "output");
  auto flat_out = output.view({-1});
  if (impl_->is_local()) {
    flat_out.copy_(input.reshape({-1}));
    return;
  }
  auto& transport = *impl_->routes.reduce;
  auto call = impl_->begin(detail::CollectiveOp::kAllGatherInto, &input,
                           transport.name(input, /*reduces=*/false));
  if (n == 0) return;
  transport.all_gather(flat_out, input, call);
}

void ProcessGroup::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  RECORD_USER_SCOPE("tandem::reduce_scatter");
  impl_->require_member("reduce_scatter");
  detail::check_dense(input, "reduce_scatter", "the input");
  detail::check_dense(output, "reduce_scatter", "the output");
  check_avg(input, op, "reduce_scatter");
  const int world = impl_->world_size;
  const int64_t n = output.numel();
  check_whole(input, output, world, "reduce_scatter", "input");
  auto flat_out = output.view({-1});
  if (impl_->is_local()) {
    flat_out.copy_(input.reshape({-1}));
    return;
  }
  auto& transport = *impl_->routes.reduce;
  auto call = impl_->begin(detail::CollectiveOp::kReduceScatter, &input,
                           transport.name(input, /*reduces=*/true), static_cast<std::int64_t>(op));
  if (n == 0) return;
  transport.reduce_scatter(flat_out, input, op, call);
}

void ProcessGroup::barrier() {
  RECORD_USER_SCOPE("tandem::barrier");
  impl_->require_member("barrier");
  if (impl_->is_local()) return;
  auto call = impl_->begin(detail::CollectiveOp::kBarrier, nullptr, "gloo");
  impl_->routes.broadcast->barrier(call);
}

std::vector<std::vector<std::uint8_t>> ProcessGroup::all_gather_bytes(
    const std::vector<std::uint8_t>& bytes) {
  RECORD_USER_SCOPE("tandem::all_gather_bytes");
  impl_->require_member("all_gather_bytes");
  if (impl_->is_local()) return {bytes};
  // Sizes differ between ranks by design: the fingerprint holds no shape.
  auto call = impl_->begin(detail::CollectiveOp::kAllGatherBytes, nullptr, "gloo");
  return impl_->gather_bytes(bytes, call);
}

std::vector<std::vector<std::uint8_t>> ProcessGroup::Impl::gather_bytes(
    const std::vector<std::uint8_t>& bytes, const Call& call) {
  if (is_local()) return {bytes};
  auto size = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  auto sizes = gather_tensor(size, call);
  int64_t longest = 1;
  for (const auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  auto padded = at::zeros({longest}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), padded.data_ptr<std::uint8_t>());
  auto gathered = gather_tensor(padded, call);
  std::vector<std::vector<std::uint8_t>> result;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const auto* data = gathered[r].data_ptr<std::uint8_t>();
    result.emplace_back(data, data + sizes[r].item<int64_t>());
  }
  return result;
}

std::vector<std::string> ProcessGroup::all_gather_strings(const std::string& text) {
  impl_->require_member("all_gather_strings");
  auto gathered = all_gather_bytes(std::vector<std::uint8_t>(text.begin(), text.end()));
  std::vector<std::string> result;
  for (const auto& bytes : gathered) result.emplace_back(bytes.begin(), bytes.end());
  return result;
}

}  // namespace tandem
