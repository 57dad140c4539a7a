// ProcessGroup::gather and scatter: every rank's tensor to a root, and a
// root's tensors to every rank, on the group's exchange route (transport.h):
// shared memory when the group's ranks share a host (an exchange in which
// only the root receives, or only the root sends), c10d otherwise.

#include <ATen/record_function.h>

#include "comm/process_group_impl.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

void check_rooted_root(int root, int world, const char* op) {
  TANDEM_CHECK_ARG(root >= 0 && root < world,
                   "{}: root {} is not a rank of this group of {} ranks (0..{})", op, root, world,
                   world - 1);
}

std::vector<std::int64_t> rooted_stacked_shape(int world, const at::Tensor& part) {
  std::vector<std::int64_t> shape{world};
  shape.insert(shape.end(), part.sizes().begin(), part.sizes().end());
  return shape;
}

}  // namespace

std::vector<at::Tensor> ProcessGroup::gather(const at::Tensor& tensor, int root) {
  RECORD_USER_SCOPE("tandem::gather");
  impl_->require_member("gather");
  detail::check_dense(tensor, "gather", "the tensor");
  const int world = impl_->world_size;
  check_rooted_root(root, world, "gather");
  if (impl_->is_local()) return {tensor.clone()};
  auto& transport = *impl_->routes.exchange;
  auto call = impl_->begin(detail::CollectiveOp::kGather, &tensor,
                           transport.name(tensor, /*reduces=*/false), -1, root);
  const bool is_root = impl_->rank == root;
  at::Tensor whole = is_root ? at::empty(rooted_stacked_shape(world, tensor), tensor.options())
                             : at::Tensor();
  if (tensor.numel() > 0) transport.gather(whole, tensor, root, call);
  return is_root ? whole.unbind(0) : std::vector<at::Tensor>{};
}

void ProcessGroup::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int root) {
  RECORD_USER_SCOPE("tandem::scatter");
  impl_->require_member("scatter");
  detail::check_dense(output, "scatter", "the output");
  const int world = impl_->world_size;
  check_rooted_root(root, world, "scatter");
  const bool is_root = impl_->rank == root;
  if (is_root) {
    TANDEM_CHECK_ARG(static_cast<int>(inputs.size()) == world,
                     "scatter: the root passed {} input tensor(s); it needs one per rank ({})",
                     inputs.size(), world);
    for (std::size_t r = 0; r < inputs.size(); ++r) {
      const auto& in = inputs[r];
      TANDEM_CHECK_ARG(in.defined() && in.sizes() == output.sizes() &&
                           in.scalar_type() == output.scalar_type() &&
                           in.device() == output.device(),
                       "scatter: inputs[{}] must match the output ({} on {}), got {}", r,
                       detail::tensor_text(output), output.device().str(),
                       in.defined() ? detail::tensor_text(in) + " on " + in.device().str()
                                    : std::string("an undefined tensor"));
    }
  }
  if (impl_->is_local()) {
    output.copy_(inputs[0]);
    return;
  }
  auto& transport = *impl_->routes.exchange;
  auto call = impl_->begin(detail::CollectiveOp::kScatter, &output,
                           transport.name(output, /*reduces=*/false), -1, root);
  if (output.numel() == 0) return;
  transport.scatter(output, inputs, root, call);
}

}  // namespace tandem
