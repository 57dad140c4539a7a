// ProcessGroup::all_to_all, with equal and with uneven splits along dim 0.
//
// The group's exchange route carries it (transport.h): shared memory when the
// group's ranks share a host (CPU tensors), c10d otherwise (Gloo, NCCL for
// CUDA tensors). The uneven form first gathers every
// rank's split sizes: the transport needs the whole matrix to agree on its
// rounds, and Gloo given sizes that disagree overruns a buffer or hangs, so
// the ranks check them and name the pair that disagrees.

#include <numeric>

#include <ATen/record_function.h>

#include "comm/process_group_impl.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using SplitSizes = std::vector<std::int64_t>;

// Bytes of one row (dim 0 index) of `tensor`.
std::int64_t all_to_all_row_bytes(const at::Tensor& tensor) {
  std::int64_t row = static_cast<std::int64_t>(tensor.element_size());
  for (std::int64_t d = 1; d < tensor.dim(); ++d) row *= tensor.size(d);
  return row;
}

void check_all_to_all_pair(const at::Tensor& output, const at::Tensor& input) {
  detail::check_dense(input, "all_to_all", "the input");
  detail::check_dense(output, "all_to_all", "the output");
  TANDEM_CHECK_ARG(input.dim() >= 1 && output.dim() == input.dim() &&
                       output.sizes().slice(1) == input.sizes().slice(1) &&
                       output.scalar_type() == input.scalar_type() &&
                       output.device() == input.device(),
                   "all_to_all: output {} on {} and input {} on {} must have the same dtype, "
                   "device and sizes past dim 0 (the splits cut dim 0; a 0-d tensor has none)",
                   detail::tensor_text(output), output.device().str(), detail::tensor_text(input),
                   input.device().str());
}

void check_all_to_all_splits(const SplitSizes& splits, std::int64_t rows, int world, const char* name) {
  TANDEM_CHECK_ARG(static_cast<int>(splits.size()) == world,
                   "all_to_all: {} has {} entries; it needs one per rank of the group ({})", name,
                   splits.size(), world);
  for (std::size_t r = 0; r < splits.size(); ++r) {
    TANDEM_CHECK_ARG(splits[r] >= 0, "all_to_all: {}[{}] is {}; split sizes cannot be negative",
                     name, r, splits[r]);
  }
  const std::int64_t sum = std::accumulate(splits.begin(), splits.end(), std::int64_t{0});
  TANDEM_CHECK_ARG(sum == rows,
                   "all_to_all: {} sums to {} rows but the tensor's dim 0 has {}; the splits "
                   "must cut dim 0 exactly",
                   name, sum, rows);
}

// Rows sent from rank src to rank dst: sent[src * world + dst].
SplitSizes exchange_splits(ProcessGroup::Impl& impl, const SplitSizes& output_splits,
                       const SplitSizes& input_splits, const ProcessGroup::Impl::Call& call) {
  const int world = impl.world_size;
  at::Tensor mine = at::empty({2 * world}, at::kLong);
  auto* m = mine.data_ptr<std::int64_t>();
  std::copy(input_splits.begin(), input_splits.end(), m);
  std::copy(output_splits.begin(), output_splits.end(), m + world);
  auto rows = impl.gather_tensor(mine, call);
  SplitSizes sent(static_cast<std::size_t>(world) * world);
  for (int src = 0; src < world; ++src) {
    const auto* row = rows[static_cast<std::size_t>(src)].data_ptr<std::int64_t>();
    for (int dst = 0; dst < world; ++dst) {
      const std::int64_t expected =
          rows[static_cast<std::size_t>(dst)].data_ptr<std::int64_t>()[world + src];
      if (row[dst] != expected) {
        TANDEM_THROW(UsageError,
                     "{}: {} sends {} row(s) to {} (its input_splits[{}]) but {} expects {} from "
                     "{} (its output_splits[{}]). Each rank's input_splits[r] must equal rank "
                     "r's output_splits[that rank]; exchange the counts first (an all_to_all of "
                     "the split sizes, as with torch's all_to_all_single)",
                     call.what, impl.group.name(src), row[dst], impl.group.name(dst), dst,
                     impl.group.name(dst), expected, impl.group.name(src), src);
      }
      sent[static_cast<std::size_t>(src) * world + dst] = row[dst];
    }
  }
  return sent;
}

// Moves the rows; every rank passes the same `sent` matrix.
void run_all_to_all(detail::Transport& transport, at::Tensor& output, const at::Tensor& input,
                    detail::AllToAllPlan plan, const ProcessGroup::Impl::Call& call) {
  const std::int64_t total = std::accumulate(plan.sent.begin(), plan.sent.end(), std::int64_t{0});
  if (total == 0 || all_to_all_row_bytes(input) == 0) return;  // alike on every rank: nothing moves
  transport.all_to_all(output, input, plan, call);
}

}  // namespace

void ProcessGroup::all_to_all(at::Tensor& output, const at::Tensor& input) {
  RECORD_USER_SCOPE("tandem::all_to_all");
  impl_->require_member("all_to_all");
  check_all_to_all_pair(output, input);
  const int world = impl_->world_size;
  TANDEM_CHECK_ARG(output.sizes() == input.sizes() && input.size(0) % world == 0,
                   "all_to_all: equal splits need input and output of one shape whose dim 0 "
                   "divides by world_size ({}), got input {} and output {}; pass split sizes "
                   "for uneven blocks",
                   world, detail::tensor_text(input), detail::tensor_text(output));
  if (impl_->is_local()) {
    output.copy_(input);
    return;
  }
  auto& transport = *impl_->routes.exchange;
  auto call = impl_->begin(detail::CollectiveOp::kAllToAll, &input,
                           transport.name(input, /*reduces=*/false));
  detail::AllToAllPlan plan;
  plan.output_splits.assign(static_cast<std::size_t>(world), input.size(0) / world);
  plan.input_splits = plan.output_splits;
  plan.sent.assign(static_cast<std::size_t>(world) * world, input.size(0) / world);
  plan.even = true;
  run_all_to_all(transport, output, input, std::move(plan), call);
}

void ProcessGroup::all_to_all(at::Tensor& output, const at::Tensor& input,
                              const std::vector<std::int64_t>& output_splits,
                              const std::vector<std::int64_t>& input_splits) {
  RECORD_USER_SCOPE("tandem::all_to_all");
  impl_->require_member("all_to_all");
  check_all_to_all_pair(output, input);
  const int world = impl_->world_size;
  check_all_to_all_splits(input_splits, input.size(0), world, "input_splits");
  check_all_to_all_splits(output_splits, output.size(0), world, "output_splits");
  if (impl_->is_local()) {
    TANDEM_CHECK_ARG(input_splits[0] == output_splits[0],
                     "all_to_all: rank 0 sends itself {} row(s) (input_splits[0]) but expects {} "
                     "(output_splits[0]); in a group of one rank they must be equal",
                     input_splits[0], output_splits[0]);
    output.copy_(input);
    return;
  }
  auto& transport = *impl_->routes.exchange;
  auto call = impl_->begin(detail::CollectiveOp::kAllToAllUneven, &input,
                           transport.name(input, /*reduces=*/false), -1, -1,
                           /*rows_vary=*/true);
  detail::AllToAllPlan plan;
  plan.sent = exchange_splits(*impl_, output_splits, input_splits, call);
  plan.output_splits = output_splits;
  plan.input_splits = input_splits;
  run_all_to_all(transport, output, input, std::move(plan), call);
}

}  // namespace tandem
