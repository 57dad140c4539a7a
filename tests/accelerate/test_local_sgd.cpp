// LocalSGD: K local steps of plain SGD on each rank, then the mean of the
// replicas, equals the same recipe computed here on one process; between
// averages the replicas really do drift apart.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/local_sgd.h"
#include "tandem/core/error.h"

namespace tandem {
namespace local_sgd_test {

using testing::copy_state;
using testing::Dataset;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::make_dataset;
using testing::Mlp;
using testing::reference_init;
using testing::run_ranks;

constexpr int64_t kBatch = 3;
constexpr double kLr = 0.05;

at::Tensor flat_params(const torch::nn::Module& model) {
  std::vector<at::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

at::Tensor rows(const at::Tensor& t, int world, int r, int64_t step) {
  return t.narrow(0, (step * world + r) * kBatch, kBatch);
}

// The closed form: every rank's replica takes plain SGD steps on its own
// batches; after every k-th step, and at the end, all replicas become their
// mean. Single process, no tandem.
at::Tensor local_sgd_reference(const Mlp& init, const Dataset& data, int world, int64_t k,
                               int64_t steps) {
  std::vector<Mlp> replicas;
  std::vector<std::shared_ptr<torch::optim::SGD>> sgds;
  for (int r = 0; r < world; ++r) {
    replicas.emplace_back(kIn, kHidden, kOut);
    copy_state(*replicas.back(), *init);
    sgds.push_back(std::make_shared<torch::optim::SGD>(replicas.back()->parameters(),
                                                       torch::optim::SGDOptions(kLr)));
  }
  auto average = [&] {
    torch::NoGradGuard no_grad;
    const auto params0 = replicas[0]->parameters();
    for (std::size_t i = 0; i < params0.size(); ++i) {
      at::Tensor sum = torch::zeros_like(params0[i]);
      for (auto& m : replicas) sum += m->parameters()[i];
      for (auto& m : replicas) m->parameters()[i].copy_(sum / world);
    }
  };
  for (int64_t s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) {
      sgds[r]->zero_grad();
      torch::mse_loss(replicas[r](rows(data.x, world, r, s)), rows(data.y, world, r, s)).backward();
      sgds[r]->step();
    }
    if ((s + 1) % k == 0) average();
  }
  average();  // the final one, when LocalSGD ends
  return flat_params(*replicas[0]);
}

class LocalSGDParity : public ::testing::TestWithParam<int> {};

TEST_P(LocalSGDParity, KLocalStepsThenTheMeanEqualTheClosedForm) {
  const int world = GetParam();
  constexpr int64_t kLocalSteps = 3, kSteps = 7;  // two averages, then a final one
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * kSteps);
  const at::Tensor expected = local_sgd_reference(init, data, world, kLocalSteps, kSteps);

  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(kLr)));
    const int r = pg.rank();
    {
      LocalSGD local_sgd(accelerator, model, kLocalSteps);
      for (int64_t s = 0; s < kSteps; ++s) {
        optimizer->zero_grad();
        accelerator.backward(
            torch::mse_loss(model->forward(rows(data.x, world, r, s)), rows(data.y, world, r, s)));
        optimizer->step();
        local_sgd.step();
        const auto all = pg.all_gather(flat_params(*model));
        const bool averaged = (s + 1) % kLocalSteps == 0;
        EXPECT_EQ(torch::equal(all[0], all[1]), averaged)
            << "after step " << s + 1 << ": replicas should " << (averaged ? "" : "not ")
            << "agree";
      }
      EXPECT_EQ(local_sgd.num_steps(), kSteps);
    }  // the final average
    const at::Tensor params = flat_params(*model);
    EXPECT_TRUE(torch::allclose(params, expected, 1e-5, 1e-6))
        << "rank " << r << " max diff " << (params - expected).abs().max().item<double>();
    // Synchronisation is back on: a backward averages the gradients again.
    optimizer->zero_grad();
    accelerator.backward(
        torch::mse_loss(model->forward(rows(data.x, world, r, 0)), rows(data.y, world, r, 0)));
    const auto grads = pg.all_gather(model->fc1->weight.grad().reshape({-1}).contiguous());
    EXPECT_TRUE(torch::equal(grads[0], grads[world - 1]));
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalSGDParity, ::testing::Values(2, 3));

// A bf16 model steps through fp32 masters: averaging only the bf16 values
// would be undone by the next step, which copies each rank's own master
// back. After the final average and one synchronised step, the replicas
// must still be identical.
TEST_P(LocalSGDParity, AveragesTheFp32MastersOfABf16Model) {
  const int world = GetParam();
  constexpr int64_t kSteps = 3;
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * (kSteps + 1));
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    model->to(torch::kBFloat16);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(kLr)));
    const int r = pg.rank();
    auto train_step = [&](int64_t s) {
      optimizer->zero_grad();
      auto x = rows(data.x, world, r, s).to(torch::kBFloat16);
      auto y = rows(data.y, world, r, s).to(torch::kBFloat16);
      accelerator.backward(torch::mse_loss(model->forward(x), y));
      optimizer->step();
    };
    {
      LocalSGD local_sgd(accelerator, model, /*local_sgd_steps=*/2);
      for (int64_t s = 0; s < kSteps; ++s) {
        train_step(s);
        local_sgd.step();
      }
      local_sgd.finish();
      const auto all = pg.all_gather(flat_params(*model));
      EXPECT_TRUE(torch::equal(all[0], all[world - 1])) << "not averaged at finish()";
    }
    train_step(kSteps);  // synchronised again
    const auto all = pg.all_gather(flat_params(*model));
    EXPECT_TRUE(torch::equal(all[0], all[world - 1]))
        << "rank " << r << ": the replicas drifted after the average (masters not averaged)";
  });
}

TEST(LocalSGDErrors, RefusesZeroAndBadSteps) {
  run_ranks(2, [&](ProcessGroup& pg) {
    Config config;
    config.zero.stage = 1;
    Accelerator accelerator(pg.shared_from_this(), config);
    Mlp model(kIn, kHidden, kOut);
    accelerator.prepare_model(model);
    accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(kLr)));
    EXPECT_THROW({ LocalSGD local_sgd(accelerator, model, 4); }, UsageError);
  });
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    accelerator.prepare_model(model);
    EXPECT_THROW({ LocalSGD local_sgd(accelerator, model, 0); }, UsageError);
  });
}

}  // namespace local_sgd_test
}  // namespace tandem
