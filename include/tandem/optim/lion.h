#pragma once
// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023)
// as DeepSpeed defines it (FusedLion, DeepSpeedCPULion: the optimizer
// config's "Lion"), for LibTorch:
//
//   tandem::Lion lion(model->parameters(), tandem::LionOptions(1e-4).weight_decay(0.1));
//
// Per element, with c = beta1 * m + (1 - beta1) * g:
//   p <- p * (1 - lr * weight_decay) - lr * sign(c)
//   m <- beta2 * m + (1 - beta2) * g
// sign(0) is 0, as torch.sign and the paper (DeepSpeed's GPU kernel moves an
// element whose c is exactly 0 by +lr, its CPU kernel by -lr or +lr after the
// sign of the zero; tandem moves it not at all). One state tensor per
// parameter, exp_avg (m). ZeRO stages 1-3 shard it (tandem/zero/zero_optimizer.h).

#include <tuple>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

namespace tandem {

struct LionOptions : torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as torch's options
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, weight_decay) = 0;

  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }

 public:  // TORCH_ARG leaves what follows it private
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

struct LionParamState : torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(torch::Tensor, exp_avg);

 public:  // TORCH_ARG leaves what follows it private
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Lion : public torch::optim::Optimizer {
 public:
  // UsageError for lr or weight_decay < 0, or betas outside [0, 1].
  explicit Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LionOptions defaults = {});
  explicit Lion(std::vector<torch::Tensor> params, LionOptions defaults = {});
  torch::Tensor step(LossClosure closure = nullptr) override;
  // torch::save / torch::load, as torch::optim's optimizers: the options of
  // every group and each parameter's exp_avg.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace tandem
