// LocalSGD: K local steps of plain SGD on each rank, then the mean of the
// replicas, equals the same recipe computed here on one process; between
// averages the replicas really do drift apart.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/log_capture.h"
#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/local_sgd.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

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

// A LocalSGD run through save_state/load_state: `stop_at` optimizer steps
// in all, each rank on its own rows; saves to `dir` after step `save_at`, or
// first loads `dir` (with the LocalSGD built before or after the load).
struct LocalSGDSegment {
  int world = 2;
  int64_t local_steps = 4;
  int64_t stop_at = 8;
  int64_t save_at = -1;
  bool resume = false;
  bool construct_before_load = false;
  double momentum = 0;
  bool bf16 = false;  // a bf16 model: the optimizer steps fp32 masters
};

struct LocalSGDTrace {
  int64_t num_steps_after_load = -1;
  int64_t since_average_after_load = -1;
  std::vector<int64_t> agreed_after;  // optimizer steps after which the replicas agreed
  at::Tensor params;                  // rank 0's at the end, before the final average
};

LocalSGDTrace train_local_sgd(const LocalSGDSegment& s, const std::string& dir, const Mlp& init,
                              const Dataset& data) {
  LocalSGDTrace trace;
  run_ranks(s.world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    if (s.bf16) model->to(torch::kBFloat16);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(kLr).momentum(s.momentum)));
    const auto dtype = s.bf16 ? torch::kBFloat16 : torch::kFloat;
    std::optional<LocalSGD> local_sgd;
    if (s.construct_before_load || !s.resume) local_sgd.emplace(accelerator, model, s.local_steps);
    if (s.resume) accelerator.load_state(dir);
    if (!local_sgd) local_sgd.emplace(accelerator, model, s.local_steps);
    if (pg.rank() == 0) {
      trace.num_steps_after_load = local_sgd->num_steps();
      trace.since_average_after_load = local_sgd->steps_since_average();
    }
    const int r = pg.rank();
    while (accelerator.step() < s.stop_at) {
      const int64_t step = accelerator.step();
      optimizer->zero_grad();
      const auto x = rows(data.x, s.world, r, step).to(dtype);
      accelerator.backward(
          torch::mse_loss(model->forward(x), rows(data.y, s.world, r, step).to(dtype)));
      optimizer->step();
      local_sgd->step();
      const auto all = pg.all_gather(flat_params(*model));
      if (pg.rank() == 0 && torch::equal(all[0], all[s.world - 1])) {
        trace.agreed_after.push_back(accelerator.step());
      }
      if (accelerator.step() == s.save_at) accelerator.save_state(dir);
    }
    if (pg.rank() == 0) trace.params = flat_params(*model);
    local_sgd->finish();
  });
  return trace;
}

TEST_P(LocalSGDParity, ResumedRunsAverageAtTheStepsTheUninterruptedOneDoes) {
  const int world = GetParam();
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * 12);
  LocalSGDSegment straight;
  straight.world = world;
  straight.stop_at = 12;
  const LocalSGDTrace expected = train_local_sgd(straight, "", init, data);
  ASSERT_EQ(expected.agreed_after, (std::vector<int64_t>{4, 8, 12}));
  for (bool before : {false, true}) {
    SCOPED_TRACE(before ? "LocalSGD built before load_state" : "built after load_state");
    testing::ScratchDir dir;
    LocalSGDSegment first = straight;
    first.stop_at = first.save_at = 6;  // between averages: the replicas differ
    train_local_sgd(first, dir.path(), init, data);
    LocalSGDSegment second = straight;
    second.resume = true;
    second.construct_before_load = before;
    const LocalSGDTrace resumed = train_local_sgd(second, dir.path(), init, data);
    EXPECT_EQ(resumed.num_steps_after_load, 6);
    EXPECT_EQ(resumed.since_average_after_load, 2);
    // Not at 10 (6 + 4): the count goes on from the checkpoint's.
    EXPECT_EQ(resumed.agreed_after, (std::vector<int64_t>{8, 12}));
    // Every rank went on from its own replica.
    EXPECT_TRUE(torch::equal(resumed.params, expected.params))
        << "max diff " << (resumed.params - expected.params).abs().max().item<double>();
  }
}

void expect_local_sgd_momentum_resume(int world, bool bf16) {
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * 12);
  LocalSGDSegment straight;
  straight.world = world;
  straight.stop_at = 11;
  straight.momentum = 0.9;
  straight.bf16 = bf16;
  const LocalSGDTrace expected = train_local_sgd(straight, "", init, data);
  testing::ScratchDir dir;
  LocalSGDSegment first = straight;
  first.stop_at = first.save_at = 5;
  train_local_sgd(first, dir.path(), init, data);
  LocalSGDSegment second = straight;
  second.resume = true;
  const LocalSGDTrace resumed = train_local_sgd(second, dir.path(), init, data);
  EXPECT_EQ(resumed.agreed_after, std::vector<int64_t>{8});
  EXPECT_TRUE(torch::equal(resumed.params, expected.params))
      << "max diff " << (resumed.params - expected.params).abs().max().item<double>();
}

TEST_P(LocalSGDParity, MomentumSavedBetweenAveragesResumesExactly) {
  // Each rank's momentum differs all along, and its replica between
  // averages: both are saved per rank.
  expect_local_sgd_momentum_resume(GetParam(), /*bf16=*/false);
}
TEST_P(LocalSGDParity, Bf16MastersSavedBetweenAveragesResumeExactly) {
  expect_local_sgd_momentum_resume(GetParam(), /*bf16=*/true);
}

TEST_P(LocalSGDParity, SavedRightAfterAnAverageResumesExactly) {
  const int world = GetParam();
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * 12);
  LocalSGDSegment straight;
  straight.world = world;
  straight.stop_at = 10;
  const LocalSGDTrace expected = train_local_sgd(straight, "", init, data);
  testing::ScratchDir dir;
  LocalSGDSegment first = straight;
  first.stop_at = first.save_at = 4;
  const std::string log = testing::info_log_of([&] { train_local_sgd(first, dir.path(), init, data); });
  EXPECT_EQ(log.find("LocalSGD"), std::string::npos) << log;
  LocalSGDSegment second = straight;
  second.resume = true;
  const LocalSGDTrace resumed = train_local_sgd(second, dir.path(), init, data);
  EXPECT_EQ(resumed.agreed_after, std::vector<int64_t>{8});
  EXPECT_EQ(expected.agreed_after, (std::vector<int64_t>{4, 8}));
  EXPECT_TRUE(torch::equal(resumed.params, expected.params))
      << "max diff " << (resumed.params - expected.params).abs().max().item<double>();
}

TEST(LocalSGDErrors, AtAnotherWorldSizeLoadStateSaysEveryRankStartsFromRank0s) {
  const Mlp init = reference_init();
  const Dataset data = make_dataset(3 * kBatch * 8);
  testing::ScratchDir dir;
  LocalSGDSegment first;
  first.stop_at = first.save_at = 5;
  first.momentum = 0.9;
  train_local_sgd(first, dir.path(), init, data);
  LocalSGDSegment second = first;
  second.world = 3;
  second.stop_at = 8;
  second.save_at = -1;
  second.resume = true;
  LocalSGDTrace resumed;
  const std::string log =
      testing::info_log_of([&] { resumed = train_local_sgd(second, dir.path(), init, data); });
  EXPECT_NE(log.find("saved by 2 ranks; this run has 3, so every rank continues from rank 0's"),
            std::string::npos)
      << log;
  EXPECT_EQ(resumed.num_steps_after_load, 5);
  EXPECT_EQ(resumed.since_average_after_load, 0);  // rank 0's replica everywhere
  EXPECT_EQ(resumed.agreed_after, std::vector<int64_t>{8});
}

}  // namespace local_sgd_test
}  // namespace tandem
