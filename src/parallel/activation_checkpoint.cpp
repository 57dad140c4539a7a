// tandem::checkpoint as a custom autograd Function: the forward runs the block
// without grad and keeps its inputs, the generator states and the autocast
// state; the backward runs the block again with grad from detached copies of
// the inputs and backpropagates the incoming gradients through it with a
// nested backward, which also accumulates the parameters' gradients.

#include "tandem/parallel/activation_checkpoint.h"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include "parallel/checkpoint_context.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CheckpointState : torch::CustomClassHolder {
  CheckpointFunction fn;
  CheckpointOptions options;
  std::vector<bool> input_defined;   // per argument position
  bool dummy_input = false;          // a last input only to make the node record
  std::vector<bool> output_defined;  // per returned tensor
  RngSnapshot rng;
  AutocastSnapshot autocast;
};

// The argument list from the defined inputs (the node's own inputs, without
// the dummy), with undefined tensors back in their places.
std::vector<at::Tensor> spread_inputs(const CheckpointState& state,
                                      const std::vector<at::Tensor>& defined) {
  std::vector<at::Tensor> out;
  out.reserve(state.input_defined.size());
  std::size_t next = 0;
  for (bool is_defined : state.input_defined) {
    out.push_back(is_defined ? defined.at(next++) : at::Tensor());
  }
  return out;
}

std::vector<at::Tensor> defined_only(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) {
    if (t.defined()) out.push_back(t);
  }
  return out;
}

std::vector<c10::Device> cuda_devices_of(at::TensorList inputs) {
  std::vector<c10::Device> devices;
  for (const auto& t : inputs) {
    if (!t.is_cuda()) continue;
    bool seen = false;
    for (const auto& d : devices) seen = seen || d == t.device();
    if (!seen) devices.push_back(t.device());
  }
  return devices;
}

struct CheckpointFunctionNode : torch::autograd::Function<CheckpointFunctionNode> {
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<CheckpointState>& state,
                               at::TensorList inputs) {
    // Unused outputs get no gradient (instead of zeros) in backward.
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> real(inputs.begin(), inputs.end() - (state->dummy_input ? 1 : 0));
    ctx->save_for_backward(real);
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    if (state->options.preserve_rng_state) state->rng = RngSnapshot::take(cuda_devices_of(real));
    state->autocast = AutocastSnapshot::take();
    std::vector<at::Tensor> outputs;
    {
      AutocastCacheOff no_cache;
      RecomputeFlag first_forward(false);
      outputs = state->fn(spread_inputs(*state, real));
    }
    for (const auto& t : outputs) state->output_defined.push_back(t.defined());
    return defined_only(outputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(
        ctx->saved_data["state"].toCapsule());
    TANDEM_CHECK_ARG(torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
                     "tandem::checkpoint: a checkpointed block's backward runs its forward again "
                     "and backpropagates through it with a nested backward pass, which cannot "
                     "run under torch::autograd::grad() or backward() with `inputs`; call "
                     "loss.backward() (or accelerator.backward(loss)) without inputs, or switch "
                     "activation checkpointing off for this pass");
    TANDEM_CHECK_ARG(!c10::GradMode::is_enabled(),
                     "tandem::checkpoint: backward with create_graph (double backward) is not "
                     "supported through a checkpointed block; switch activation checkpointing "
                     "off for this pass");

    std::vector<at::Tensor> detached;
    for (const auto& saved : ctx->get_saved_variables()) {
      at::Tensor d = saved.detach();
      if (saved.requires_grad()) d.requires_grad_(true);
      detached.push_back(std::move(d));
    }
    std::vector<at::Tensor> outputs;
    {
      std::optional<RngScope> rng;
      if (state->options.preserve_rng_state) rng.emplace(state->rng);
      AutocastScope autocast(state->autocast);
      at::AutoGradMode grad_on(true);
      RecomputeFlag recompute(true);
      outputs = state->fn(spread_inputs(*state, detached));
    }
    std::vector<bool> defined_now;
    for (const auto& t : outputs) defined_now.push_back(t.defined());
    TANDEM_CHECK_ARG(defined_now == state->output_defined,
                     "tandem::checkpoint: the block returned {} tensor(s) ({} defined) when run "
                     "again in backward, but {} ({} defined) in its forward; a checkpointed "
                     "function must return the same tensors each time it runs",
                     defined_now.size(), defined_only(outputs).size(),
                     state->output_defined.size(),
                     std::count(state->output_defined.begin(), state->output_defined.end(), true));
    outputs = defined_only(outputs);

    std::vector<at::Tensor> roots, root_grads;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && i < grads.size() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) {
      NestedBackwardScope nested;
      torch::autograd::backward(roots, root_grads);
    }

    variable_list result;
    result.emplace_back();  // the state argument
    for (const auto& d : detached) result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    if (state->dummy_input) result.emplace_back();
    return result;
  }
};

}  // namespace
}  // namespace detail

std::vector<at::Tensor> checkpoint_tensors(CheckpointFunction fn, std::vector<at::Tensor> inputs,
                                           const CheckpointOptions& options) {
  TANDEM_CHECK_ARG(static_cast<bool>(fn), "tandem::checkpoint_tensors: fn is empty");
  if (!c10::GradMode::is_enabled()) return fn(inputs);
  detail::count_checkpointed_forward();

  auto state = c10::make_intrusive<detail::CheckpointState>();
  state->fn = std::move(fn);
  state->options = options;
  std::vector<at::Tensor> node_inputs;
  bool any_requires_grad = false;
  for (auto& t : inputs) {
    state->input_defined.push_back(t.defined());
    if (!t.defined()) continue;
    any_requires_grad = any_requires_grad || t.requires_grad();
    node_inputs.push_back(std::move(t));
  }
  inputs.clear();
  // A node records only if an input requires grad; the block's parameters
  // do, but are not inputs. An empty tensor that requires grad stands in,
  // so that a first block fed plain data still trains.
  if (!any_requires_grad) {
    state->dummy_input = true;
    auto options = node_inputs.empty() ? at::TensorOptions() : at::TensorOptions().device(
                                                                   node_inputs.front().device());
    node_inputs.push_back(at::empty({0}, options.dtype(at::kFloat)).requires_grad_(true));
  }
  torch::autograd::variable_list defined_outputs =
      detail::CheckpointFunctionNode::apply(state, at::TensorList(node_inputs));
  std::vector<at::Tensor> outputs;
  std::size_t next = 0;
  for (bool is_defined : state->output_defined) {
    outputs.push_back(is_defined ? defined_outputs.at(next++) : at::Tensor());
  }
  return outputs;
}

std::size_t set_activation_checkpointing(torch::nn::Module& model, bool enabled) {
  std::set<CheckpointedModule*> marked;
  if (auto* self = dynamic_cast<CheckpointedModule*>(&model)) marked.insert(self);
  for (const auto& child : model.modules(/*include_self=*/false)) {
    if (auto* m = dynamic_cast<CheckpointedModule*>(child.get())) marked.insert(m);
  }
  for (CheckpointedModule* m : marked) m->set_checkpointing(enabled);
  return marked.size();
}

std::size_t apply_activation_checkpointing(torch::nn::Module& model,
                                           const ActivationCheckpointingConfig& config) {
  if (!config.enabled) return 0;
  const std::size_t count = set_activation_checkpointing(model, true);
  if (count == 0) {
    log_warn("the config turns activation checkpointing on (an activation_checkpointing "
             "block, or Accelerate's fsdp_activation_checkpointing), but the model marks no "
             "block with tandem::Checkpointed<Impl> (or Sharded<CheckpointedImpl<Impl>>), so "
             "nothing is checkpointed; mark the blocks to recompute in the model's definition");
  }
  return count;
}

}  // namespace tandem
