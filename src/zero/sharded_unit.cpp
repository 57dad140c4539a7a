// tandem::ShardedUnit's out-of-line part: what a Sharded<Impl> calls around
// its wrapped constructor and forward (include/tandem/zero/sharded.h).

#include "tandem/zero/sharded.h"

#include "tandem/core/error.h"
#include "zero/sharded_hooks.h"
#include "zero/unit_shard.h"

namespace tandem {

void ShardedUnit::unit_constructed(torch::nn::Module& module) {
  detail::cut_at_construction(*this, module);
}

bool ShardedUnit::begin_forward() {
  if (hooks_ != nullptr) {
    hooks_->before_forward();
    return true;
  }
  TANDEM_CHECK_ARG(construction_shard_ == nullptr,
                   "tandem::Sharded: this unit was built under tandem::zero::Init and holds only "
                   "this rank's shard of its parameters; build the stage-3 ZeroOptimizer over "
                   "the model (or prepare the model and optimizer with the Accelerator under "
                   "ZeRO-3) before running it, or build the model without zero::Init");
  return false;
}

at::Tensor ShardedUnit::end_forward(at::Tensor output) {
  return hooks_->after_forward(std::move(output));
}

}  // namespace tandem
