// Stage 1: gradients land in (or are moved into) their group's flat buffer,
// and the buffer is averaged across the ranks in one all-reduce per group.

#include "zero/flat_all_reduce.h"

#include <ATen/ATen.h>

#include "core/torch_internals.h"
#include "parallel/flat_grad.h"

namespace tandem::detail {

FlatAllReduce::FlatAllReduce(const ZeroLayout& layout, ProcessGroup& pg, CommQueue& queue)
    : layout_(layout), pg_(pg), queue_(queue) {}

void FlatAllReduce::gradient_ready(std::size_t index) {
  // AccumulateGrad allocates a fresh .grad the first time (or after the
  // user set it to none): moving it into the buffer, and .grad onto the
  // view, lets one all-reduce cover the group and later backwards accumulate
  // in place. A parameter with no gradient gets a zeroed slice.
  const FlatGroup& group = layout_.groups()[layout_.group_of()[index]];
  const at::Tensor& param = layout_.params()[index];
  adopt_into(param.mutable_grad(),
             internals::flat_alias(group.grad_full, layout_.flat_offset(index), param.sizes()));
}

void FlatAllReduce::launch(std::size_t index) {
  // The task holds what it uses, not the policy: the queue may still run it
  // while the engine is being destroyed (the layout outlives the queue).
  const FlatGroup* g = &layout_.groups()[index];
  queue_.submit([pg = &pg_, g, flat = g->grad_full]() mutable {
    pg->all_reduce(flat, ReduceOp::kAvg);
    if (!g->grad_shard_is_view) {
      torch::NoGradGuard no_grad;
      g->grad_shard.copy_(g->grad_full.narrow(0, g->shard_begin, g->shard_numel));
    }
  });
}

void FlatAllReduce::zero_grad() {
  torch::NoGradGuard no_grad;
  for (const auto& group : layout_.groups()) {
    group.grad_full.zero_();
    if (!group.grad_shard_is_view) group.grad_shard.zero_();
  }
}

}  // namespace tandem::detail
