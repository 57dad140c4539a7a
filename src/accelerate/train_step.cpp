// Accelerator::train_step: one micro-step as a callable, eager or captured
// (tandem/accelerate/train_step.h, accelerate/cuda_graph_step.h).

#include "tandem/accelerate/train_step.h"

#include <string>
#include <typeinfo>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "accelerate/accelerator_impl.h"
#include "accelerate/cuda_graph_step.h"
#include "accelerate/prepared_internals.h"
#include "tandem/core/error.h"

namespace tandem {

struct TrainStep::Impl {
  Accelerator* accelerator = nullptr;
  std::shared_ptr<AcceleratedOptimizer> optimizer;
  LossFunction loss;
  std::unique_ptr<detail::GraphedStep> graphed;

  at::Tensor loss_under_autocast(const std::vector<at::Tensor>& batch) const {
    auto autocast = accelerator->autocast();
    return loss(batch);
  }

  at::Tensor eager(const std::vector<at::Tensor>& batch) const {
    at::Tensor value = loss_under_autocast(batch);
    accelerator->backward(value);
    optimizer->step();
    optimizer->zero_grad();
    return value.detach();
  }
};

namespace {

// Why a captured step cannot run here, or empty. Checked when the step is
// made, so that a misconfigured run stops before its first batch.
std::string graph_refusal(const Accelerator& accelerator, const Config& config,
                          bool sharded, detail::OptimizerCore& core) {
  const CudaGraphConfig& graph = config.cuda_graph;
  if (graph.warmup_steps < 1 || graph.max_captures < 1) {
    return fmt::format("cuda_graph.warmup_steps ({}) and max_captures ({}) must be at least 1",
                       graph.warmup_steps, graph.max_captures);
  }
  if (!accelerator.device().is_cuda()) {
    return fmt::format(
        "the Accelerator runs on {}, and a CUDA graph captures GPU kernels only. Turn "
        "cuda_graph off for CPU runs (the eager step is the same arithmetic)",
        accelerator.device().str());
  }
  if (!detail::cuda_graphs_built()) {
    return "this tandem was built against a CPU-only LibTorch; build it against a CUDA "
           "LibTorch to capture steps";
  }
  if (accelerator.num_processes() > 1) {
    return fmt::format(
        "the run has {} processes (backend {}). Captured steps are implemented for one "
        "process per run: the gradient all-reduce would have to be captured with the step "
        "(NCCL can be; Gloo cannot), which is not implemented yet. Train on one process, or "
        "turn cuda_graph off",
        accelerator.num_processes(), accelerator.process_group()->backend_name());
  }
  if (sharded) {
    return "ZeRO (zero_optimization.stage 1-3) keeps its own flat buffers and gathers "
           "parameters on the host's schedule, which a captured step does not replay. Set "
           "zero_optimization.stage to 0, or turn cuda_graph off";
  }
  const auto& wrapped = typeid(core.wrapped());
  if (wrapped != typeid(torch::optim::AdamW) && wrapped != typeid(torch::optim::Adam)) {
    return "the optimizer is not torch::optim::Adam or AdamW: the captured update is PyTorch's "
           "fused Adam/AdamW kernel with the step count and learning rate on the device. Use "
           "Adam or AdamW, or turn cuda_graph off";
  }
  if (core.master_weights() != nullptr) {
    return "the optimizer keeps fp32 master weights for low-precision parameters, which the "
           "captured update does not; keep the parameters in fp32 (autocast computes in bf16)";
  }
  if (core.timed()) {
    std::vector<std::string> keys;
    if (config.wall_clock_breakdown) keys.emplace_back("wall_clock_breakdown");
    if (config.steps_per_print.value_or(0) > 0) keys.emplace_back("steps_per_print");
    if (config.tensorboard.enabled) keys.emplace_back("tensorboard.enabled");
    if (config.csv_monitor.enabled) keys.emplace_back("csv_monitor.enabled");
    return fmt::format(
        "{} time the step's forward, backward and update apart (the monitors also read each "
        "micro-step's loss back), and a captured step runs them as one graph; turn {} off, or "
        "cuda_graph off",
        keys.empty() ? std::string("the step timer") : fmt::format("{}", fmt::join(keys, ", ")),
        keys.size() > 1 ? "them" : "it");
  }
  return {};
}

}  // namespace

TrainStep::TrainStep(Accelerator& accelerator, std::shared_ptr<AcceleratedOptimizer> optimizer,
                     LossFunction loss)
    : impl_(std::make_unique<Impl>()) {
  TANDEM_CHECK_ARG(optimizer != nullptr, "Accelerator::train_step: the optimizer is null");
  TANDEM_CHECK_ARG(static_cast<bool>(loss), "Accelerator::train_step: the loss function is empty");
  impl_->accelerator = &accelerator;
  impl_->optimizer = std::move(optimizer);
  impl_->loss = std::move(loss);
  Accelerator::Impl& s = *accelerator.impl_;
  detail::OptimizerCore& core = detail::PreparedAccess::core(*impl_->optimizer);
  const Config& config = accelerator.config();
  if (!config.cuda_graph.enabled) return;
  // The strategy factory says whether models are sharded (their optimizers
  // bind to them); the stage is its to read.
  const std::string refusal =
      graph_refusal(accelerator, config, s.strategies->binds_optimizers(), core);
  TANDEM_CHECK_ARG(refusal.empty(), "cuda_graph: {}", refusal);
  detail::GraphedStepParts parts;
  parts.optimizer = impl_->optimizer.get();
  parts.core = &core;
  parts.controller = s.prepared.controller();
  Impl* self = impl_.get();
  parts.autocast_loss = [self](const std::vector<at::Tensor>& b) {
    return self->loss_under_autocast(b);
  };
  parts.eager_step = [self](const std::vector<at::Tensor>& b) { return self->eager(b); };
  parts.config = config.cuda_graph;
  parts.gradient_clipping = config.gradient_clipping;
  parts.scaling = core.scales_loss();
  parts.device = accelerator.device();
  impl_->graphed = detail::make_graphed_step(std::move(parts));
}

TrainStep::TrainStep(TrainStep&&) noexcept = default;
TrainStep& TrainStep::operator=(TrainStep&&) noexcept = default;
TrainStep::~TrainStep() = default;

at::Tensor TrainStep::operator()(const std::vector<at::Tensor>& batch) {
  // A captured step copies the host batch straight into its static inputs.
  if (impl_->graphed) return impl_->graphed->run(batch);
  const c10::Device device = impl_->accelerator->device();
  std::vector<at::Tensor> on_device;
  on_device.reserve(batch.size());
  for (const auto& t : batch) {
    on_device.push_back(t.device() == device ? t : t.to(device, /*non_blocking=*/true));
  }
  return impl_->eager(on_device);
}

bool TrainStep::graphed() const { return impl_->graphed && impl_->graphed->replayed(); }

int64_t TrainStep::captures() const { return impl_->graphed ? impl_->graphed->captures() : 0; }

TrainStep Accelerator::train_step(std::shared_ptr<AcceleratedOptimizer> optimizer,
                                  LossFunction loss) {
  return TrainStep(*this, std::move(optimizer), std::move(loss));
}

}  // namespace tandem
