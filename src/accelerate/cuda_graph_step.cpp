// Whole training steps as CUDA graphs (cuda_graph_step.h).

#include "accelerate/cuda_graph_step.h"

#if defined(TANDEM_WITH_CUDA)

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <typeinfo>
#include <unordered_set>
#include <utility>

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_zero.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "accelerate/captured_gradients.h"
#include "accelerate/prepared_internals.h"
#include "accelerate/step_controller.h"
#include "optim/clip_on_device.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/amp/autocast.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem::detail {
namespace {

// The parameters of one fused launch: one group, dtype and step count.
// `grads` are the gradients the graph being captured reads. Their optimizer
// states are looked up by `keys` each time (a load_state() replaces the
// state objects, so no pointer to one is kept).
struct AdamLaunch {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  std::vector<void*> keys;  // the optimizer state map's keys (TensorImpl*)
  at::Tensor step;          // fp32 on the device, shared by the bucket's parameters
  int64_t host_step = 0;    // what `step` holds, as the host counts it
  std::size_t group = 0;
};

// What a graph baked in besides tensor addresses: each group's Adam
// constants. A change captures again.
using GroupConstants = std::tuple<double, double, double, double, bool>;

// The graphs of one batch signature (shapes and dtypes).
struct Captured {
  std::vector<at::Tensor> inputs;  // static, on the device: each replay reads these
  std::unique_ptr<at::cuda::CUDAGraph> accumulate, step;
  at::Tensor accumulate_loss, step_loss;  // static outputs
  // Without accumulation: the gradients the stepping graph made, kept with it.
  std::vector<at::Tensor> grads;
};

// Work queued on `waited` so far runs before work queued on `waiter` next.
void wait_for(const at::cuda::CUDAStream& waiter, const at::cuda::CUDAStream& waited) {
  at::cuda::CUDAEvent event;
  event.record(waited);
  event.block(waiter);
}

std::string signature(const std::vector<at::Tensor>& batch) {
  std::string s;
  for (const auto& t : batch) s += c10::str(t.scalar_type(), t.sizes(), ";");
  return s;
}

class CudaGraphStep final : public GraphedStep {
 public:
  explicit CudaGraphStep(GraphedStepParts parts)
      : p_(std::move(parts)),
        decoupled_(typeid(p_.core->wrapped()) == typeid(torch::optim::AdamW)),
        pool_(at::cuda::graph_pool_handle()),
        side_(at::cuda::getStreamFromPool(/*isHighPriority=*/false, p_.device.index())) {}

  at::Tensor run(const std::vector<at::Tensor>& batch) override {
    replayed_ = false;
    const GradientState& state = p_.controller->state();
    // Capture from an accumulation cycle's start, after the warm-up steps.
    if (!capturing_ && (eager_steps_ < p_.config.warmup_steps || state.micro_step != 0)) {
      return warm_up(batch);
    }
    capturing_ = true;
    if (!layout_matches()) invalidate();
    if (!accumulating()) refuse_gradients_from_outside();
    const std::string key = signature(batch);
    auto found = captured_.find(key);
    if (found == captured_.end()) {
      TANDEM_CHECK_ARG(static_cast<int64_t>(captured_.size()) < p_.config.max_captures,
                       "cuda_graph: a batch of a new shape ({}) after {} captured shapes "
                       "(cuda_graph.max_captures). Each shape is captured once; give the "
                       "batches fixed shapes (drop_last, padding to a fixed length) or raise "
                       "max_captures",
                       key, captured_.size());
      Captured fresh;
      for (const auto& t : batch) {
        fresh.inputs.push_back(at::empty(t.sizes(), t.options().device(p_.device)));
      }
      found = captured_.emplace(key, std::move(fresh)).first;
    }
    Captured& c = found->second;
    // Straight from the program's (pinned) host batch into the static inputs.
    for (std::size_t i = 0; i < batch.size(); ++i) c.inputs[i].copy_(batch[i], /*non_blocking=*/true);

    p_.controller->before_backward();  // begins the micro-step
    const bool stepping = p_.controller->state().sync_gradients;
    if (stepping) {
      p_.core->sync_learning_rates(*p_.optimizer);
      refresh_device_values();
    }
    refresh_loss_factor();
    std::unique_ptr<at::cuda::CUDAGraph>& graph = stepping ? c.step : c.accumulate;
    at::Tensor& loss = stepping ? c.step_loss : c.accumulate_loss;
    if (!graph) {
      try {
        graph = capture(c, stepping, loss);
      } catch (...) {
        // A shape that never captured does not count against max_captures.
        if (!c.accumulate && !c.step) captured_.erase(key);
        throw;
      }
      ++captures_;
      layout_ = current_layout();
    }
    graph->replay();
    replayed_ = true;
    p_.controller->after_backward();
    if (stepping) {
      // The graph keeps the gradients it made (Captured::grads); without
      // accumulation the parameters let go of them, as an eager zero_grad()
      // does in one process, so an eager backward after this step starts
      // afresh instead of adding to the captured step's gradients.
      if (!accumulating()) release_gradients(/*bucketed_too=*/true);
      // fp16: the one read back of a captured step, between steps.
      const bool found_inf = p_.scaling && found_inf_.item<float>() > 0;
      if (!p_.core->record_graphed_step(*p_.optimizer, found_inf)) {
        for (auto& bucket : buckets_) {
          for (std::size_t i = 0; i < bucket.keys.size(); ++i) bump_step(*state_of(bucket, i));
          ++bucket.host_step;
        }
      }
    }
    return loss.clone();
  }

  bool replayed() const override { return replayed_; }
  int64_t captures() const override { return captures_; }

 private:
  at::Tensor warm_up(const std::vector<at::Tensor>& batch) {
    wait_for(side_, at::cuda::getCurrentCUDAStream(p_.device.index()));
    at::Tensor loss;
    {
      c10::cuda::CUDAStreamGuard guard(side_);
      const int64_t before = p_.controller->state().optimizer_steps;
      std::vector<at::Tensor> on_device;
      for (const auto& t : batch) on_device.push_back(t.to(p_.device, /*non_blocking=*/true));
      loss = p_.eager_step(on_device);
      if (p_.controller->state().optimizer_steps > before) ++eager_steps_;
    }
    wait_for(at::cuda::getCurrentCUDAStream(p_.device.index()), side_);
    return loss;
  }

  // Buckets of the parameters with a state (an eager step updated them). With
  // accumulation their gradients are allocated here, outside any graph, so
  // every graph accumulates into the same ones; without, each stepping
  // capture's backward makes them (adopted, as after zero_grad: no add).
  void build_buckets() {
    buckets_.clear();
    constants_.clear();
    torch::NoGradGuard no_grad;
    auto& groups = p_.optimizer->param_groups();
    auto& states = p_.optimizer->state();
    std::unordered_set<void*> seen;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      constants_.push_back(constants_of(groups[g].options()));
      // Parameters that started stepping at different times count their
      // bias correction apart, as the eager step's fused launches do.
      std::map<std::pair<at::ScalarType, int64_t>, AdamLaunch> by_dtype_and_step;
      for (auto& param : groups[g].params()) {
        if (!param.requires_grad() || !seen.insert(param.unsafeGetTensorImpl()).second) continue;
        auto found = states.find(param.unsafeGetTensorImpl());
        if (found == states.end()) continue;  // never stepped: no gradient reaches it
        TANDEM_CHECK_ARG(param.device() == p_.device && param.is_non_overlapping_and_dense(),
                         "cuda_graph: parameter of shape {} on {} is not a dense tensor on the "
                         "Accelerator's device {}; a captured step updates dense parameters "
                         "on the GPU only",
                         c10::str(param.sizes()), param.device().str(), p_.device.str());
        if (accumulating() && !param.grad().defined()) {
          param.mutable_grad() = at::zeros_like(param, at::MemoryFormat::Preserve);
        }
        const auto [avg, avg_sq, max_sq, step] = moments(*found->second);
        AdamLaunch& b = by_dtype_and_step[{param.scalar_type(), step}];
        b.group = g;
        b.host_step = step;
        b.params.push_back(param);
        b.keys.push_back(param.unsafeGetTensorImpl());
        b.exp_avgs.push_back(avg);
        b.exp_avg_sqs.push_back(avg_sq);
        if (max_sq.defined()) b.max_exp_avg_sqs.push_back(max_sq);
      }
      for (auto& [key, bucket] : by_dtype_and_step) buckets_.push_back(std::move(bucket));
    }
    for (auto& b : buckets_) {
      b.step = at::full({}, static_cast<double>(b.host_step),
                        at::TensorOptions().dtype(at::kFloat).device(p_.device));
      b.steps.assign(b.params.size(), b.step);
    }
    lrs_.clear();
    lr_values_.clear();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const double lr = groups[g].options().get_lr();
      lrs_.push_back(at::full({}, lr, at::TensorOptions().dtype(at::kFloat).device(p_.device)));
      lr_values_.push_back(lr);
    }
    // The clipping norm sums the gradients in the eager step's order.
    std::unordered_set<const c10::TensorImpl*> in_buckets;
    for (const auto& b : buckets_) {
      for (const auto& param : b.params) in_buckets.insert(param.unsafeGetTensorImpl());
    }
    optimizer_params_ = unique_optimizer_parameters(*p_.optimizer);
    clip_params_.clear();
    for (const auto& param : optimizer_params_) {
      if (in_buckets.count(param.unsafeGetTensorImpl()) > 0) clip_params_.push_back(param);
    }
    bucketed_ = std::move(in_buckets);
    accumulation_steps_ = p_.controller->state().accumulation_steps;
    layout_ = current_layout();
    built_ = true;
  }

  bool accumulating() const { return p_.controller->state().accumulation_steps > 1; }

  GroupConstants constants_of(const torch::optim::OptimizerOptions& options) const {
    if (decoupled_) {
      const auto& o = static_cast<const torch::optim::AdamWOptions&>(options);
      return {std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
              o.amsgrad()};
    }
    const auto& o = static_cast<const torch::optim::AdamOptions&>(options);
    return {std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
            o.amsgrad()};
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t> moments(
      torch::optim::OptimizerParamState& s) const {
    if (decoupled_) {
      auto& w = static_cast<torch::optim::AdamWParamState&>(s);
      return {w.exp_avg(), w.exp_avg_sq(), w.max_exp_avg_sq(), w.step()};
    }
    auto& a = static_cast<torch::optim::AdamParamState&>(s);
    return {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq(), a.step()};
  }

  void bump_step(torch::optim::OptimizerParamState& s) const {
    if (decoupled_) {
      auto& w = static_cast<torch::optim::AdamWParamState&>(s);
      w.step(w.step() + 1);
    } else {
      auto& a = static_cast<torch::optim::AdamParamState&>(s);
      a.step(a.step() + 1);
    }
  }

  // The optimizer's state of bucket parameter i; null once it is gone.
  torch::optim::OptimizerParamState* state_of(const AdamLaunch& b, std::size_t i) const {
    auto& states = p_.optimizer->state();
    auto found = states.find(b.keys[i]);
    return found == states.end() ? nullptr : found->second.get();
  }

  // The addresses a graph reads and writes: a load_state() or code that
  // replaced a tensor makes the graphs stale, and they are captured again.
  // The gradients count only with accumulation: without, each stepping
  // graph makes and keeps its own, whatever the parameters hold.
  std::vector<const void*> current_layout() const {
    std::vector<const void*> layout;
    for (const auto& b : buckets_) {
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        torch::optim::OptimizerParamState* state = state_of(b, i);
        if (state == nullptr) return {};  // a state removed: never equal to a built layout
        const auto [avg, avg_sq, max_sq, step] = moments(*state);
        const at::Tensor& grad = b.params[i].grad();
        layout.push_back(b.params[i].data_ptr());
        if (accumulating()) layout.push_back(grad.defined() ? grad.data_ptr() : nullptr);
        layout.push_back(avg.data_ptr());
        layout.push_back(avg_sq.data_ptr());
        layout.push_back(max_sq.defined() ? max_sq.data_ptr() : nullptr);
      }
    }
    return layout;
  }

  bool layout_matches() const {
    if (!built_) return false;
    auto& groups = p_.optimizer->param_groups();
    if (groups.size() != constants_.size()) return false;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (constants_of(groups[g].options()) != constants_[g]) return false;
    }
    if (p_.controller->state().accumulation_steps != accumulation_steps_) return false;
    return current_layout() == layout_ && steps_uniform();
  }

  // Whether each bucket's parameters still share one step count (eager
  // steps in between may have skipped a parameter without a gradient);
  // after current_layout() matched, so every state exists.
  bool steps_uniform() const {
    for (const auto& b : buckets_) {
      if (b.keys.empty()) continue;
      const int64_t first = std::get<3>(moments(*state_of(b, 0)));
      for (std::size_t i = 1; i < b.keys.size(); ++i) {
        if (std::get<3>(moments(*state_of(b, i))) != first) return false;
      }
    }
    return true;
  }

  // Drops every graph and captures into a fresh memory pool: the
  // allocator cannot take a pool back once all graphs that used it are
  // gone.
  void invalidate() {
    captured_.clear();
    pool_ = at::cuda::graph_pool_handle();
    build_buckets();
  }

  // Before a stepping replay: the learning rates a scheduler set, and the
  // step count if code outside changed the host's (a load_state()).
  void refresh_device_values() {
    auto& groups = p_.optimizer->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const double lr = groups[g].options().get_lr();
      if (lr != lr_values_[g]) {
        lrs_[g].fill_(lr);
        lr_values_[g] = lr;
      }
    }
    for (auto& b : buckets_) {
      if (b.keys.empty()) continue;
      const int64_t host = std::get<3>(moments(*state_of(b, 0)));
      if (host != b.host_step) {
        b.step.fill_(static_cast<double>(host));
        b.host_step = host;
      }
    }
  }

  // On the device, the factor backward multiplies the fp32 loss by: 1 /
  // accumulation steps, times the scale under fp16 (in double, as backward()).
  void refresh_loss_factor() {
    const double factor =
        p_.core->loss_scale() / static_cast<double>(p_.controller->state().accumulation_steps);
    if (!loss_factor_.defined()) {
      const auto options = at::TensorOptions().dtype(at::kFloat).device(p_.device);
      loss_factor_ = at::full({}, factor, options);
      inv_scale_ = at::full({1}, 1.0 / p_.core->loss_scale(), options);
      found_inf_ = at::zeros({1}, options);
      factor_value_ = factor;
    } else if (factor != factor_value_) {
      loss_factor_.fill_(factor);
      inv_scale_.fill_(1.0 / p_.core->loss_scale());
      factor_value_ = factor;
    }
  }

  // The update the stepping graph ends with; the same arithmetic as the
  // eager step on CUDA (under fp16 the fused unscale and inf/NaN check, then
  // clip_grad_norm_on_device, then PyTorch's fused Adam/AdamW kernels, which
  // leave the parameters and moments alone when found_inf is set), on the
  // gradients the captured backward left.
  void update(Captured& c) {
    torch::NoGradGuard no_grad;
    for (auto& b : buckets_) {
      b.grads.clear();
      for (const auto& param : b.params) {
        if (!param.grad().defined()) refuse_untrained_parameter(param);
        b.grads.push_back(with_strides_of(param, param.grad()));
      }
    }
    std::vector<at::Tensor> grads;
    for (const auto& param : clip_params_) grads.push_back(param.grad());
    std::optional<at::Tensor> found_inf;
    if (p_.scaling && !grads.empty()) {
      found_inf_.zero_();
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale_);
      found_inf = found_inf_;
    }
    if (p_.gradient_clipping > 0 && !grads.empty()) {
      clip_grad_norm_on_device(grads, p_.gradient_clipping);
    }
    for (auto& b : buckets_) {
      const auto [beta1, beta2, weight_decay, eps, amsgrad] = constants_[b.group];
      b.step.add_(1);
      if (decoupled_) {
        at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs,
                          b.steps, lrs_[b.group], beta1, beta2, weight_decay, eps, amsgrad,
                          /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
      } else {
        at::_fused_adam_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs,
                         b.steps, lrs_[b.group], beta1, beta2, weight_decay, eps, amsgrad,
                         /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
      }
      // A skipped step does not count (PyTorch's capturable Adam does the same).
      if (found_inf) b.step.sub_(found_inf_.reshape({}));
    }
    if (accumulating()) {
      if (!grads.empty()) at::_foreach_zero_(grads);
    } else {
      c.grads = grads;
    }
  }

  // Sets .grad to None for the optimizer's parameters outside the buckets
  // (never stepped in the warm-up), and with bucketed_too for all.
  void release_gradients(bool bucketed_too) {
    for (auto& param : optimizer_params_) {
      if (!param.grad().defined()) continue;
      if (bucketed_too || bucketed_.count(param.unsafeGetTensorImpl()) == 0) {
        param.mutable_grad() = at::Tensor();
      }
    }
  }

  // Without accumulation a captured step makes its own gradients and
  // leaves .grad None; a gradient there now came from a backward outside
  // the step (accelerator.backward() by hand, not zeroed since), which a
  // replay would drop where the eager step adds it in.
  void refuse_gradients_from_outside() const {
    for (const auto& param : optimizer_params_) {
      TANDEM_CHECK_ARG(!param.grad().defined(),
                       "cuda_graph: a parameter of shape {} holds a gradient from a backward "
                       "outside the captured step; the captured step makes its own and would "
                       "drop it, where an eager step adds it in. After a backward of your own, "
                       "take it with optimizer->step() and optimizer->zero_grad(), or discard "
                       "it by setting the parameters' .grad to None, before the next captured "
                       "step (or turn cuda_graph off)",
                       c10::str(param.sizes()));
    }
  }

  // A parameter outside the buckets (the warm-up never stepped it) that the
  // captured backward reached: the graph's update would leave it unchanged
  // where an eager step updates it.
  void refuse_untracked_gradients() {
    for (const auto& param : optimizer_params_) {
      TANDEM_CHECK_ARG(!param.grad().defined() || bucketed_.count(param.unsafeGetTensorImpl()) > 0,
                       "cuda_graph: a parameter of shape {} got a gradient in the captured step "
                       "but none in the eager warm-up steps (none that were not skipped), so the "
                       "captured update would leave it unchanged; raise cuda_graph.warmup_steps "
                       "until the warm-up trains every parameter the step trains, or turn "
                       "cuda_graph off (a parameter group added, or a checkpoint loaded without "
                       "this parameter's state, after the warm-up cannot be captured)",
                       c10::str(param.sizes()));
    }
  }

  std::unique_ptr<at::cuda::CUDAGraph> capture(Captured& c, bool stepping, at::Tensor& loss_out) {
    const std::vector<at::Tensor>& inputs = c.inputs;
    // Without accumulation every .grad is None here (run() refused any
    // other), so the capture's backward makes the gradients in the graph's
    // pool.
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    wait_for(side_, at::cuda::getCurrentCUDAStream(p_.device.index()));
    {
      c10::cuda::CUDAStreamGuard guard(side_);
      // Casts cached across the capture's edge would be stale on replay.
      const bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      graph->capture_begin(pool_);
      // The capture ends (and the autocast cache is restored) on every path,
      // and the next capture takes a fresh pool: PyTorch gives a pool back
      // only for captures that ended, and reusing one it holds or has let
      // go of is refused.
      auto abandon = [&] {
        try {
          graph->capture_end();
        } catch (const std::exception&) {  // the capture was invalidated
        }
        at::autocast::set_autocast_cache_enabled(cache);
        pool_ = at::cuda::graph_pool_handle();
        // The capture's backward bound gradients whose kernels never ran
        // (with accumulation, only to parameters outside the buckets): an
        // eager step after the refusal must not add to them.
        release_gradients(/*bucketed_too=*/!accumulating());
      };
      try {
        at::Tensor loss = p_.autocast_loss(inputs);
        at::Tensor scaled = to_fp32(loss);
        if (p_.scaling || factor_value_ != 1.0) scaled = scaled * loss_factor_;
        {
          std::optional<ReachedHooks> hooks;
          if (accumulating()) {
            std::vector<at::Tensor> params;
            for (const auto& b : buckets_) {
              params.insert(params.end(), b.params.begin(), b.params.end());
            }
            hooks.emplace(params);
          }
          scaled.backward();
          if (hooks) hooks->check();
        }
        refuse_untracked_gradients();
        if (stepping) update(c);
        loss_out = loss.detach();
        graph->capture_end();
      } catch (const UsageError&) {  // tandem's own refusal: as it is
        abandon();
        throw;
      } catch (const std::exception& e) {
        abandon();
        TANDEM_CHECK_ARG(false,
                         "cuda_graph: capturing the training step failed: {}\nA captured step "
                         "must not read tensors back to the host (.item(), printing a tensor, "
                         "a shape that depends on values) or synchronise the device inside the "
                         "loss function. Move such reads after the step, or turn cuda_graph off",
                         e.what());
      }
      at::autocast::set_autocast_cache_enabled(cache);
    }
    wait_for(at::cuda::getCurrentCUDAStream(p_.device.index()), side_);
    return graph;
  }

  GraphedStepParts p_;
  bool decoupled_;
  at::cuda::MempoolId_t pool_;
  at::cuda::CUDAStream side_;
  int64_t eager_steps_ = 0;
  bool capturing_ = false;
  bool replayed_ = false;
  int64_t captures_ = 0;
  int64_t accumulation_steps_ = 0;  // the accumulation the graphs were built for
  bool built_ = false;              // build_buckets() ran (its buckets may be empty)
  std::unordered_set<const c10::TensorImpl*> bucketed_;  // the buckets' parameters
  std::vector<AdamLaunch> buckets_;
  std::vector<GroupConstants> constants_;
  std::vector<at::Tensor> lrs_;
  std::vector<double> lr_values_;
  std::vector<const void*> layout_;
  std::vector<at::Tensor> clip_params_;  // bucket parameters, in the eager step's order
  std::vector<at::Tensor> optimizer_params_;  // every parameter of the optimizer, once
  at::Tensor loss_factor_;  // 0-dim fp32: scale / accumulation steps
  at::Tensor inv_scale_, found_inf_;  // [1] fp32, as the eager unscale's
  double factor_value_ = 0;
  std::map<std::string, Captured> captured_;
};

}  // namespace

bool cuda_graphs_built() { return true; }

std::unique_ptr<GraphedStep> make_graphed_step(GraphedStepParts parts) {
  return std::make_unique<CudaGraphStep>(std::move(parts));
}

}  // namespace tandem::detail

#endif  // TANDEM_WITH_CUDA (cuda_graph_step_cpu.cpp: a CPU-only LibTorch)
