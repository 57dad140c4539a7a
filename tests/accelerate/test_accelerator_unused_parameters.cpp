// A parameter no rank uses in a step (a branch not taken, a head frozen for
// a while): under the Accelerator's DDP with find_unused_parameters it gets
// no gradient, and the optimizer skips it (no momentum, no weight decay), as
// in one process and in PyTorch's DDP after zero_grad(). The Accelerator's
// zero_grad keeps DDP's bucket views, so this is the reducer's doing.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/parity.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace accelerator_unused_parameters {
namespace {

using testing::run_ranks;
using testing::Params;

struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    trunk = register_module("trunk", torch::nn::Linear(5, 8));
    left = register_module("left", torch::nn::Linear(8, 3));
    right = register_module("right", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_right) {
    const auto h = torch::tanh(trunk(x));
    return use_right ? right(h) : left(h);
  }
  torch::nn::Linear trunk{nullptr}, left{nullptr}, right{nullptr};
};
TORCH_MODULE(TwoHeads);

constexpr int kSteps = 5, kPerRank = 3;

// Step s uses the right head on steps 1 and 2, the left one otherwise; on
// step 3 the trunk is frozen (requires_grad off), and thawed after.
bool uses_right(int step) { return step == 1 || step == 2; }
bool trunk_frozen(int step) { return step == 3; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(TwoHeads& model, bool adamw) {
  if (adamw) {
    return std::make_unique<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  }
  return std::make_unique<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
}

// One process, the whole global batch: LibTorch's own loop.
Params train_alone(int world, bool adamw, const torch::Tensor& x, const torch::Tensor& y) {
  torch::manual_seed(11);
  TwoHeads model;
  auto optimizer = make_optimizer(model, adamw);
  for (int s = 0; s < kSteps; ++s) {
    model->trunk->weight.requires_grad_(!trunk_frozen(s));
    optimizer->zero_grad();
    const auto rows = x.narrow(0, s * world * kPerRank, world * kPerRank);
    const auto targets = y.narrow(0, s * world * kPerRank, world * kPerRank);
    torch::mse_loss(model->forward(rows, uses_right(s)), targets).backward();
    optimizer->step();
  }
  return testing::snapshot(*model);
}

Params train_ddp(int world, bool adamw, const torch::Tensor& x, const torch::Tensor& y) {
  Config config;
  config.ddp.find_unused_parameters = true;
  std::vector<TwoHeads> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(11);
    models.emplace_back();
  }
  Params out;
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    TwoHeads model = models[pg.rank()];
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(make_optimizer(model, adamw));
    for (int s = 0; s < kSteps; ++s) {
      model->trunk->weight.requires_grad_(!trunk_frozen(s));
      optimizer->zero_grad();
      const int64_t row = (s * world + pg.rank()) * kPerRank;
      accelerator.backward(torch::mse_loss(model->forward(x.narrow(0, row, kPerRank),
                                                          uses_right(s)),
                                           y.narrow(0, row, kPerRank)));
      optimizer->step();
    }
    if (pg.rank() == 0) out = testing::snapshot(*model);
  });
  return out;
}

TEST(AcceleratorUnusedParameters, AreSkippedByTheOptimizerAsInOneProcess) {
  for (int world : {2, 3}) {
    const auto x = torch::randn({kSteps * world * kPerRank, 5});
    const auto y = torch::randn({kSteps * world * kPerRank, 3});
    for (bool adamw : {false, true}) {
      const Params alone = train_alone(world, adamw, x, y);
      const Params ddp = train_ddp(world, adamw, x, y);
      for (const auto& [name, value] : alone) {
        EXPECT_TRUE(torch::allclose(ddp.at(name), value, 1e-5, 1e-6))
            << "world " << world << (adamw ? " AdamW " : " SGD ") << name << " off by "
            << (ddp.at(name) - value).abs().max().item<float>();
      }
    }
  }
}

}  // namespace
}  // namespace accelerator_unused_parameters
}  // namespace tandem
