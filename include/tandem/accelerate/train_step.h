#pragma once
// One training micro-step as a callable (Accelerator::train_step): the
// program's forward and loss, then backward, clipping (the config's
// gradient_clipping), loss scaling and the optimizer step, with gradient
// accumulation as the Accelerator runs it.
//
//   auto step = accelerator.train_step(optimizer, [&](const std::vector<at::Tensor>& b) {
//     return torch::nn::functional::cross_entropy(model->forward(b[0]), b[1]);
//   });
//   for (...) { at::Tensor loss = step({inputs, targets}); scheduler->step(); }
//
// Eager by default: the same calls a hand-written loop makes. With CUDA
// graphs switched on (the config's `cuda_graph: {enabled: true}` or
// AcceleratorOptions::cuda_graph), the first `warmup_steps` optimizer steps
// run eagerly, then the whole step (forward, loss, backward, clipping and a
// fused Adam/AdamW update whose step count and learning rate stay on the
// device) is captured once per batch shape and replayed: one launch per
// step, no host work between kernels. docs/cuda_graphs.md says what a
// captured step may contain, and what is refused with the reason.
//
// Not thread-safe: the training thread calls it.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tandem/config/config.h"

namespace tandem {

class Accelerator;
class AcceleratedOptimizer;

// The program's part of a step: the loss of one micro-batch (a scalar), with
// the batch's tensors already on the accelerator's device. It runs under the
// Accelerator's autocast. When the step is captured, it runs once per
// capture: it must not read tensors back to the host (.item(), printing,
// data-dependent shapes) and must compute the same kernels on every call.
using LossFunction = std::function<at::Tensor(const std::vector<at::Tensor>& batch)>;

class TrainStep {
 public:
  TrainStep(Accelerator& accelerator, std::shared_ptr<AcceleratedOptimizer> optimizer,
            LossFunction loss);
  TrainStep(TrainStep&&) noexcept;
  TrainStep& operator=(TrainStep&&) noexcept;
  ~TrainStep();

  // One micro-step on `batch`, whose tensors are moved to the accelerator's
  // device. Returns the micro-batch's loss, detached, on the device (reading
  // it with .item() waits for the step). The optimizer steps on the last
  // micro-step of each accumulation cycle, as with accelerator.backward().
  at::Tensor operator()(const std::vector<at::Tensor>& batch);

  // Whether the last call replayed a captured graph.
  bool graphed() const;
  // Graphs captured so far (each batch shape captures one per kind of
  // micro-step: accumulating, and the one that steps).
  int64_t captures() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
