#pragma once
// LocalSGD (Accelerate's accelerate.local_sgd.LocalSGD): each rank trains
// its own replica for `local_sgd_steps` optimizer steps with gradient
// synchronisation off, then the ranks average their parameters; a last
// average runs when training ends. Communication drops by that factor, at
// the price of replicas that drift apart between averages.
//
//   {
//     tandem::LocalSGD local_sgd(accelerator, model, /*local_sgd_steps=*/8);
//     for (auto& batch : *loader) {
//       optimizer->zero_grad();
//       accelerator.backward(loss_fn(model->forward(batch[0]), batch[1]));
//       optimizer->step();
//       local_sgd.step();
//     }
//     local_sgd.finish();  // or let it go out of scope
//   }
//
// While it lives the model is under Accelerator::no_sync(). The average is
// the plain mean across ranks of every trainable parameter (tied ones once)
// and of the fp32 master copies a bf16/fp16 model's optimizer steps (the
// model then takes its masters' rounded values); frozen parameters and
// buffers never drift and are left alone. Optimizer state (momentum, Adam's
// moments) stays per rank, as in Accelerate. DDP only: ZeRO keeps its shards
// in step already, and is refused (UsageError), as Accelerate refuses
// DeepSpeed. Construct after preparing the model and its optimizer, on
// every rank.
//
// Thread-safety: the training thread. The LocalSGD must not outlive the
// Accelerator.

#include <cstdint>
#include <memory>
#include <optional>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tandem/accelerate/accelerator.h"

namespace tandem {

class LocalSGD {
 public:
  // `enabled` false: step() and finish() do nothing and gradients stay
  // synchronised (Accelerate's enabled flag). UsageError for
  // local_sgd_steps < 1, a model this Accelerator did not prepare, or ZeRO.
  LocalSGD(Accelerator& accelerator, std::shared_ptr<torch::nn::Module> model,
           int64_t local_sgd_steps, bool enabled = true);
  template <typename ModuleImpl>
  LocalSGD(Accelerator& accelerator, const torch::nn::ModuleHolder<ModuleImpl>& model,
           int64_t local_sgd_steps, bool enabled = true)
      : LocalSGD(accelerator, std::static_pointer_cast<torch::nn::Module>(model.ptr()),
                 local_sgd_steps, enabled) {}
  // finish(), unless an exception is unwinding (then no collective runs, so
  // no rank waits on one that failed; the replicas stay unaveraged).
  ~LocalSGD();
  LocalSGD(const LocalSGD&) = delete;
  LocalSGD& operator=(const LocalSGD&) = delete;

  // Call after each optimizer step: every local_sgd_steps-th call averages
  // the parameters across ranks. Collective on those calls.
  void step();
  // The last average, and gradient synchronisation back on. Collective;
  // once.
  void finish();

  // step() calls so far. save_state() records it, with every rank's own
  // replica and optimizer state; load_state() restores them into this
  // LocalSGD or, when the model has none yet, into the next one
  // constructed (at the same world size; at another only the count), so
  // that training goes on as without the interruption.
  int64_t num_steps() const { return num_steps_; }
  int64_t local_sgd_steps() const { return local_sgd_steps_; }
  bool enabled() const { return enabled_; }
  // step() calls since the last average: while above 0 the ranks' replicas
  // differ.
  int64_t steps_since_average() const { return enabled_ ? num_steps_ - averaged_at_ : 0; }
  // Continues counting from `num_steps` (load_state() calls it), the last
  // average `steps_since_average` steps ago: the next average comes at the
  // next multiple of local_sgd_steps. UsageError for negative counts, more
  // steps since the average than steps, or after finish().
  void set_num_steps(int64_t num_steps, int64_t steps_since_average = 0);

 private:
  Accelerator& accelerator_;
  std::size_t index_;  // the model's, in the Accelerator
  int64_t local_sgd_steps_;
  bool enabled_;
  int64_t num_steps_ = 0;
  int64_t averaged_at_ = 0;  // num_steps_ at the last average
  bool finished_ = false;
  std::optional<Accelerator::NoSyncGuard> no_sync_;
};

}  // namespace tandem
