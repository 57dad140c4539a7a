#pragma once
// LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019) as
// DeepSpeed's FusedLamb defines it (the optimizer config's "Lamb"), for
// LibTorch:
//
//   tandem::Lamb lamb(model->parameters(), tandem::LambOptions(1e-3).weight_decay(0.01));
//
// Per parameter tensor, at step t (1-based):
//   m <- beta1 * m + (1 - beta1) * g          v <- beta2 * v + (1 - beta2) * g^2
//   u  = m / (sqrt(v) + eps) + weight_decay * p   (eps_inside_sqrt: m / sqrt(v + eps))
//   r  = |p| / |u| clamped to [min_coeff, max_coeff]; 1 when either norm is 0
//   p <- p - step_size * r * u,   step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//        (lr without bias_correction)
// where |.| is the L2 norm of the whole tensor. The norms make the update of
// one element depend on the whole parameter: under ZeRO (stages 1-3) each
// rank sums the squares over its shard of each parameter and one all-reduce
// per step completes them, so sharded training matches this optimizer
// (DeepSpeed refuses Lamb under ZeRO). State per parameter: exp_avg,
// exp_avg_sq and the step count. FusedLamb's max_grad_norm is not
// implemented (clip with clip_grad_norm or gradient_clipping instead).

#include <tuple>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

namespace tandem {

struct LambOptions : torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as torch's options
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, bias_correction) = true;
  TORCH_ARG(bool, eps_inside_sqrt) = false;
  TORCH_ARG(double, max_coeff) = 10.0;
  TORCH_ARG(double, min_coeff) = 0.01;

  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }

 public:  // TORCH_ARG leaves what follows it private
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

struct LambParamState : torch::optim::OptimizerCloneableParamState<LambParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);

 public:  // TORCH_ARG leaves what follows it private
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Lamb : public torch::optim::Optimizer {
 public:
  // UsageError for lr, eps or weight_decay < 0, betas outside [0, 1), or
  // min_coeff > max_coeff.
  explicit Lamb(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LambOptions defaults = {});
  explicit Lamb(std::vector<torch::Tensor> params, LambOptions defaults = {});
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load, as torch::optim's optimizers: the options of
  // every group and each parameter's step, exp_avg and exp_avg_sq.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace tandem
