#pragma once
// The captured form of Accelerator::train_step (tandem/accelerate/train_step.h):
// after the warm-up steps, each batch shape gets up to two CUDA graphs, one
// for a micro-step that only accumulates gradients (forward, loss, backward)
// and one for the micro-step that steps (the same, then clipping, a fused
// Adam/AdamW update and zeroing the gradients). Everything that would read
// back to the host stays on the device: the step count (an fp32 tensor per
// bucket, incremented in the graph), the learning rate (a tensor the host
// refreshes before a replay when a scheduler changed it), the clipping norm
// and its scale. The host keeps the optimizer's state, the step counters
// and the learning-rate bookkeeping in step with every replay, so that
// checkpoints, schedulers and accelerator.step() see an ordinary run.
//
// Private to the Accelerator; compiled to a stub without a CUDA LibTorch.
// Not thread-safe: the training thread calls it.

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "tandem/accelerate/train_step.h"

namespace tandem::detail {

class OptimizerCore;
class StepController;

struct GraphedStepParts {
  AcceleratedOptimizer* optimizer = nullptr;
  OptimizerCore* core = nullptr;
  std::shared_ptr<StepController> controller;
  // The program's loss under the Accelerator's autocast (what is captured).
  std::function<at::Tensor(const std::vector<at::Tensor>&)> autocast_loss;
  // One eager micro-step (warm-up), returning the detached loss.
  std::function<at::Tensor(const std::vector<at::Tensor>&)> eager_step;
  CudaGraphConfig config;
  double gradient_clipping = 0;  // 0: none
  // fp16 loss scaling: the loss is multiplied by the scaler's scale (a
  // device tensor), the stepping graph unscales and checks the gradients
  // for inf/NaN on the device and skips the update there when it finds one;
  // after the replay the host reads that one flag and updates the scaler
  // (every rule: torch's, DeepSpeed's, static), as an eager step does.
  bool scaling = false;
  c10::Device device = c10::Device(c10::kCPU);
};

class GraphedStep {
 public:
  virtual ~GraphedStep() = default;
  // One micro-step (warm-up, capture or replay); `batch` is on the host or the
  // device (a replay copies it into the graph's static inputs either way).
  virtual at::Tensor run(const std::vector<at::Tensor>& batch) = 0;
  virtual bool replayed() const = 0;
  virtual int64_t captures() const = 0;
};

// Whether this build of tandem can capture (a CUDA LibTorch).
bool cuda_graphs_built();

// The captured step; null where cuda_graphs_built() is false.
std::unique_ptr<GraphedStep> make_graphed_step(GraphedStepParts parts);

}  // namespace tandem::detail
