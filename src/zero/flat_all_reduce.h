#pragma once
// ZeRO stage 1's gradient reduction, DDP's scheme: each parameter's .grad is
// a view of its group's whole flat gradient buffer (grad_full), so a
// complete group is all-reduced in place, with nothing to pack; this rank's
// fp32 shard is then the buffer's slice (or, when the update needs another
// dtype or the host, a copy of it). With gradient sync off the buffers
// accumulate locally, as DDP's no_sync, and the next synced backward
// reduces the sum.

#include <cstddef>

#include "tandem/comm/process_group.h"
#include "zero/comm_queue.h"
#include "zero/reduction_policy.h"
#include "zero/zero_layout.h"

namespace tandem::detail {

class FlatAllReduce final : public ReductionPolicy {
 public:
  // See ReductionPolicy for the contract and thread-safety.
  FlatAllReduce(const ZeroLayout& layout, ProcessGroup& pg, CommQueue& queue);

  bool reduces_backward(bool gradient_sync) const override { return gradient_sync; }
  void gradient_ready(std::size_t index) override;
  // The gradients already sit in the flat buffer: nothing to do.
  void group_complete(std::size_t /*group*/) override {}
  // Autograd accumulated into the slot, or, where it made a new tensor,
  // that tensor is brought in as gradient_ready() does.
  void add_late_gradient(std::size_t index) override { gradient_ready(index); }
  void launch(std::size_t group) override;
  void end_backward() override {}
  // Zeroes the flat buffers and the shards that are not views of them; the
  // .grad views stay, pointing at the zeros.
  void zero_grad() override;

 private:
  const ZeroLayout& layout_;
  ProcessGroup& pg_;
  CommQueue& queue_;
};

}  // namespace tandem::detail
