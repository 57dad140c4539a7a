// The two ways a prepared optimizer's update runs (optimizer_update.h).

#include "accelerate/optimizer_update.h"

#include <algorithm>

#include <ATen/ops/_foreach_zero.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/optimizer_state.h"
#include "optim/clip_on_device.h"
#include "tandem/accelerate/prepared.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/amp/master_weights.h"
#include "tandem/amp/unscale.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/zero/zero_optimizer.h"

namespace tandem::detail {
namespace {

bool has_low_precision_params(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) return true;
    }
  }
  return false;
}

// Every rank steps the whole model with the optimizer the user passed.
class ReplicatedUpdate final : public OptimizerUpdate {
 public:
  ReplicatedUpdate(AcceleratedOptimizer& self, bool keep_gradients)
      : keep_gradients_(keep_gradients) {
    // A bf16/fp16 model trains through fp32 copies (DeepSpeed's fp16/bf16
    // optimizers): updates smaller than the low-precision spacing would
    // otherwise round away.
    if (has_low_precision_params(self)) master_ = std::make_unique<MasterWeights>(self);
  }

  bool unscale(AcceleratedOptimizer& self, double inv_scale, bool check_inf) override {
    if (master_) {
      master_->copy_grads_to_master(inv_scale);
      if (!check_inf) return false;
      std::vector<at::Tensor> grads;
      for (const auto& p : master_->master_params()) grads.push_back(p.grad());
      return unscale_and_find_inf(grads, 1.0);
    }
    if (!check_inf) return false;  // nothing to scale back
    std::vector<at::Tensor> grads;
    // A tied tensor listed twice: unscale_and_find_inf() scales it once.
    for (auto& group : self.param_groups()) {
      for (auto& p : group.params()) grads.push_back(p.grad());
    }
    return unscale_and_find_inf(grads, inv_scale);
  }

  double clip(AcceleratedOptimizer& self, double max_norm, double norm_type) override {
    return clip_gradients(self, max_norm, norm_type, nullptr);
  }

  bool clip_on_device(AcceleratedOptimizer& self, double max_norm) override {
    if (master_) return false;
    std::vector<at::Tensor> grads;
    for (const auto& p : unique_optimizer_parameters(self)) {
      if (!p.grad().defined()) continue;
      if (!p.grad().is_cuda()) return false;
      grads.push_back(p.grad());
    }
    if (grads.empty()) return false;
    clip_grad_norm_on_device(grads, max_norm);
    return true;
  }

  void clip_value(AcceleratedOptimizer& self, double clip_value) override {
    torch::NoGradGuard no_grad;
    // A tied tensor listed twice is clamped once (clamping is idempotent anyway).
    for (const auto& p : unique_optimizer_parameters(self)) {
      if (p.grad().defined()) p.grad().clamp_(-clip_value, clip_value);
    }
  }

  void check_closure(const torch::optim::Optimizer::LossClosure&) const override {}

  at::Tensor apply(torch::optim::Optimizer::LossClosure closure,
                   const StepWrapped& step_wrapped) override {
    at::Tensor loss = step_wrapped(std::move(closure));
    if (master_) master_->copy_master_to_model();
    return loss;
  }

  void zero_grad(AcceleratedOptimizer& self) override {
    // Without DDP (and without masters, whose copies read the model's
    // gradients), None: the next backward adopts its gradients.
    if (!keep_gradients_ && !master_) {
      for (auto& group : self.param_groups()) {
        for (auto& p : group.params()) {
          if (p.grad().defined()) p.mutable_grad() = at::Tensor();
        }
      }
      return;
    }
    // In place, so DDP's .grad views of its buckets stay in place (no
    // set-to-None: the next backward would have to re-adopt every gradient).
    // One multi-tensor launch per device and dtype on the GPU, rather than
    // one per parameter.
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    auto add = [&grads](const at::Tensor& p) {
      if (p.grad().defined()) grads.push_back(p.grad());
    };
    for (auto& group : self.param_groups()) {
      for (auto& p : group.params()) add(p);
    }
    if (master_) {
      for (const auto& p : master_->model_params()) add(p);
    }
    if (!grads.empty()) at::_foreach_zero_(grads);
  }

  const MasterWeights* master_weights() const override { return master_.get(); }

  void add_master_names(TensorNames& names) const override {
    if (!master_) return;
    for (std::size_t i = 0; i < master_->model_params().size(); ++i) {
      names[master_->master_params()[i].unsafeGetTensorImpl()] =
          names[master_->model_params()[i].unsafeGetTensorImpl()];
    }
  }

  void describe_state(AcceleratedOptimizer& self, const TensorNames& names,
                      nlohmann::json& out) const override {
    std::vector<std::string> state_names;
    nlohmann::json steps = nlohmann::json::object();
    int64_t step = 0;
    for (const auto& p : unique_optimizer_parameters(self)) {
      const std::string& name = name_of(names, p, "save_state");
      const ParamState ps = get_param_state(self, p);
      if (ps.step >= 0) steps[name] = ps.step;
      step = std::max(step, ps.step);
      for (const auto& [sname, t] : ps.tensors) {
        if (std::find(state_names.begin(), state_names.end(), sname) == state_names.end()) {
          state_names.push_back(sname);
        }
      }
    }
    out["state_names"] = state_names;
    out["step"] = step;
    out["param_steps"] = steps;
  }

  void append_state_tensors(AcceleratedOptimizer& self, const TensorNames& names,
                            NamedTensors& out) const override {
    if (master_) {
      for (std::size_t i = 0; i < master_->model_params().size(); ++i) {
        const at::Tensor& m = master_->master_params()[i];
        if (m.unsafeGetTensorImpl() != master_->model_params()[i].unsafeGetTensorImpl()) {
          out.emplace_back(fragment_key(kMasterSection, name_of(names, m, "save_state"), 0),
                           flat(m));
        }
      }
    }
    for (const auto& p : unique_optimizer_parameters(self)) {
      const std::string& name = name_of(names, p, "save_state");
      for (const auto& [sname, t] : get_param_state(self, p).tensors) {
        out.emplace_back(fragment_key(optim_section(sname), name, 0), flat(t));
      }
    }
  }

  void restore_state(AcceleratedOptimizer& self, const CheckpointReader& checkpoint,
                     const nlohmann::json& saved, const TensorNames& names) override {
    torch::NoGradGuard no_grad;
    if (master_) {
      for (std::size_t k = 0; k < master_->model_params().size(); ++k) {
        const at::Tensor& m = master_->master_params()[k];
        const at::Tensor& model_param = master_->model_params()[k];
        if (m.unsafeGetTensorImpl() == model_param.unsafeGetTensorImpl()) continue;
        const std::string& name = name_of(names, model_param, "load_state");
        if (checkpoint.has(kMasterSection, name)) {
          checkpoint.read_range_into(kMasterSection, name, 0, m.detach());
        } else {
          m.detach().copy_(model_param.detach().to(m.scalar_type()));
        }
      }
    }
    const auto state_names = saved.value("state_names", std::vector<std::string>{});
    const nlohmann::json steps = saved.value("param_steps", nlohmann::json::object());
    for (const auto& p : unique_optimizer_parameters(self)) {
      const std::string& name = name_of(names, p, "load_state");
      ParamState ps;
      ps.step = steps.contains(name) ? steps[name].get<int64_t>()
                                     : saved.value("step", int64_t{-1});
      for (const auto& sname : state_names) {
        if (checkpoint.has(optim_section(sname), name)) {
          ps.tensors.emplace_back(
              sname, checkpoint.read_whole(optim_section(sname), name, p.sizes().vec()));
        }
      }
      set_param_state(self, p, ps);
    }
  }

 private:
  bool keep_gradients_;
  std::unique_ptr<MasterWeights> master_;
};

// ZeRO steps this rank's shard: reduced fp32 gradient shards, fp32 master
// shards and the optimizer state live in the ZeroOptimizer.
class ShardedUpdate final : public OptimizerUpdate {
 public:
  explicit ShardedUpdate(std::shared_ptr<ZeroOptimizer> zero) : zero_(std::move(zero)) {}

  bool unscale(AcceleratedOptimizer&, double inv_scale, bool check_inf) override {
    // The reduced fp32 gradient shards are what the update reads.
    return check_inf && unscale_and_find_inf(zero_->gradient_shards(), inv_scale);
  }

  double clip(AcceleratedOptimizer&, double max_norm, double norm_type) override {
    TANDEM_CHECK_ARG(norm_type == 2.0, "clip_grad_norm under ZeRO clips the L2 norm "
                     "(norm_type 2), got norm_type {}", norm_type);
    return zero_->clip_grad_norm(max_norm);
  }

  void clip_value(AcceleratedOptimizer&, double clip_value) override {
    // Element-wise, so clamping each rank's shard clamps the whole gradient.
    torch::NoGradGuard no_grad;
    for (auto& g : zero_->gradient_shards()) {
      if (g.defined()) g.clamp_(-clip_value, clip_value);
    }
  }

  void check_closure(const torch::optim::Optimizer::LossClosure& closure) const override {
    TANDEM_CHECK_ARG(closure == nullptr,
                     "optimizer->step(closure): ZeRO steps from the gradients of the last "
                     "backward and takes no closure; call step() without one");
  }

  at::Tensor apply(torch::optim::Optimizer::LossClosure, const StepWrapped&) override {
    zero_->step();
    return {};
  }

  void zero_grad(AcceleratedOptimizer&) override { zero_->zero_grad(); }

  void describe_state(AcceleratedOptimizer&, const TensorNames&,
                      nlohmann::json& out) const override {
    out["state_names"] = zero_->state_names();
    out["step"] = zero_->step_count();
    out["param_steps"] = nlohmann::json::object();
  }

  // The shards (masters and optimizer state included) are the model's to
  // save and restore: ModelStrategy::append_shard_tensors / restore_shards.
  void append_state_tensors(AcceleratedOptimizer&, const TensorNames&,
                            NamedTensors&) const override {}
  void restore_state(AcceleratedOptimizer&, const CheckpointReader&, const nlohmann::json&,
                     const TensorNames&) override {}

 private:
  std::shared_ptr<ZeroOptimizer> zero_;
};

}  // namespace

std::unique_ptr<OptimizerUpdate> make_replicated_update(AcceleratedOptimizer& self,
                                                        bool keep_gradients) {
  return std::make_unique<ReplicatedUpdate>(self, keep_gradients);
}

std::unique_ptr<OptimizerUpdate> make_sharded_update(std::shared_ptr<ZeroOptimizer> zero) {
  return std::make_unique<ShardedUpdate>(std::move(zero));
}

}  // namespace tandem::detail
