// Accelerator::no_sync and clip_grad_value: gradients stay local inside the
// guard and the next synchronised backward reduces what accumulated (the
// same update as accumulating over the micro-batches), and clamping matches
// torch's clip_grad_value_ on the averaged gradients, replicated or sharded.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace no_sync_test {

using testing::copy_state;
using testing::Dataset;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::make_dataset;
using testing::Mlp;
using testing::reference_init;
using testing::run_ranks;

constexpr int64_t kBatch = 5;  // odd: no split lines up with anything
constexpr double kLr = 0.1;

at::Tensor flat_grads(torch::nn::Module& model) {
  std::vector<at::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.grad().detach().reshape({-1}));
  return torch::cat(parts);
}

at::Tensor flat_params(const torch::nn::Module& model) {
  std::vector<at::Tensor> parts;
  for (const auto& p : model.parameters()) parts.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(parts);
}

// Rows of micro-batch `m` on rank `r` (world ranks, kBatch rows each).
at::Tensor rows(const at::Tensor& t, int world, int r, int m) {
  return t.narrow(0, (m * world + r) * kBatch, kBatch);
}

// The gradient of loss(x, y) at `init`, on one process.
at::Tensor local_grad(const Mlp& init, const at::Tensor& x, const at::Tensor& y) {
  Mlp model(kIn, kHidden, kOut);
  copy_state(*model, *init);
  torch::mse_loss(model(x), y).backward();
  return flat_grads(*model);
}

Config config_for_stage(int stage) {
  Config config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;
  return config;
}

class NoSync : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Independent references for two micro-batches per rank, computed on one
// process: each rank's own gradient of micro-batch 0, their mean, and the
// mean over ranks of each rank's summed gradient of both micro-batches.
struct TwoMicroBatches {
  std::vector<at::Tensor> g0;
  at::Tensor mean0;
  at::Tensor mean_sum;
};

TwoMicroBatches two_micro_batches(const Mlp& init, const Dataset& data, int world) {
  TwoMicroBatches ref;
  ref.g0.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    at::Tensor g0 = local_grad(init, rows(data.x, world, r, 0), rows(data.y, world, r, 0));
    at::Tensor g = g0 + local_grad(init, rows(data.x, world, r, 1), rows(data.y, world, r, 1));
    ref.mean0 = r == 0 ? g0 : ref.mean0 + g0;
    ref.mean_sum = r == 0 ? g : ref.mean_sum + g;
    ref.g0[static_cast<size_t>(r)] = g0;
  }
  ref.mean0 = ref.mean0 / world;
  ref.mean_sum = ref.mean_sum / world;
  return ref;
}

TEST_P(NoSync, GradientsStayLocalInsideAndTheSyncedBackwardMatchesAccumulation) {
  const auto [world, stage] = GetParam();
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * 2);
  const TwoMicroBatches ref = two_micro_batches(init, data, world);
  const std::vector<at::Tensor>& g0 = ref.g0;
  const at::Tensor& mean_sum = ref.mean_sum;
  const at::Tensor expected_params = flat_params(*init) - kLr * mean_sum;

  run_ranks(world, [&, world = world, stage = stage](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config_for_stage(stage));
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(kLr)));
    const int r = pg.rank();
    {
      auto guard = accelerator.no_sync(model);
      const uint64_t collectives = pg.sequence_number();
      accelerator.backward(torch::mse_loss(model->forward(rows(data.x, world, r, 0)),
                                           rows(data.y, world, r, 0)));
      EXPECT_EQ(pg.sequence_number(), collectives) << "a backward under no_sync communicated";
      if (stage == 0) {
        // Still this rank's own gradient: nothing was averaged.
        const at::Tensor mine = flat_grads(*model);
        EXPECT_TRUE(torch::allclose(mine, g0[r], 1e-5, 1e-6)) << "rank " << r;
        const auto all = pg.all_gather(mine);
        EXPECT_FALSE(torch::allclose(all[0], all[1])) << "ranks agree inside no_sync";
      }
    }
    const uint64_t collectives = pg.sequence_number();
    accelerator.backward(torch::mse_loss(model->forward(rows(data.x, world, r, 1)),
                                         rows(data.y, world, r, 1)));
    EXPECT_GT(pg.sequence_number(), collectives) << "the synced backward did not communicate";
    if (stage == 0) {
      const at::Tensor synced = flat_grads(*model);
      EXPECT_TRUE(torch::allclose(synced, mean_sum, 1e-5, 1e-6))
          << "rank " << r << " max diff " << (synced - mean_sum).abs().max().item<double>();
    }
    optimizer->step();
    const at::Tensor params = flat_params(*model);
    EXPECT_TRUE(torch::allclose(params, expected_params, 1e-5, 1e-6))
        << "rank " << r << " stage " << stage << " max diff "
        << (params - expected_params).abs().max().item<double>();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, NoSync,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 1)));

// Accelerate's GradientAccumulationPlugin(sync_each_batch=True): every
// micro-step's backward reduces, so no unreduced gradients wait between
// micro-steps, and the step is still the accumulation over the cycle.
class SyncEachBatch : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SyncEachBatch, EveryBackwardReducesAndTheStepEqualsAccumulation) {
  const auto [world, stage] = GetParam();
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch * 2);
  const TwoMicroBatches ref = two_micro_batches(init, data, world);
  const at::Tensor& mean0 = ref.mean0;
  const at::Tensor& mean_sum = ref.mean_sum;
  // Two micro-steps per cycle: backward() halves each loss.
  const at::Tensor expected_params = flat_params(*init) - kLr * mean_sum / 2;

  run_ranks(world, [&, world = world, stage = stage](ProcessGroup& pg) {
    Config config = config_for_stage(stage);
    config.gradient_accumulation_steps = 2;
    AcceleratorOptions options;
    options.sync_each_batch = true;
    Accelerator accelerator(pg.shared_from_this(), config, options);
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(kLr)));
    const int r = pg.rank();
    for (int m = 0; m < 2; ++m) {
      const uint64_t collectives = pg.sequence_number();
      accelerator.backward(torch::mse_loss(model->forward(rows(data.x, world, r, m)),
                                           rows(data.y, world, r, m)));
      EXPECT_EQ(accelerator.sync_gradients(), m == 1);
      EXPECT_GT(pg.sequence_number(), collectives) << "micro-step " << m << " did not reduce";
      if (stage == 0 && m == 0) {
        const at::Tensor reduced = flat_grads(*model);
        EXPECT_TRUE(torch::allclose(reduced, mean0 / 2, 1e-5, 1e-6))
            << "rank " << r << " max diff " << (reduced - mean0 / 2).abs().max().item<double>();
      }
      optimizer->step();
      optimizer->zero_grad();
      if (m == 0) {
        EXPECT_TRUE(torch::equal(flat_params(*model), flat_params(*init)))
            << "the optimizer stepped inside the cycle";
      }
    }
    const at::Tensor params = flat_params(*model);
    EXPECT_TRUE(torch::allclose(params, expected_params, 1e-5, 1e-6))
        << "rank " << r << " stage " << stage << " max diff "
        << (params - expected_params).abs().max().item<double>();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, SyncEachBatch,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 1, 2)));

TEST(NoSyncErrors, IsRefusedUnderZeroStages2And3) {
  const Mlp init = reference_init();
  for (int stage : {2, 3}) {
    run_ranks(2, [&](ProcessGroup& pg) {
      Accelerator accelerator(pg.shared_from_this(), config_for_stage(stage));
      Mlp model(kIn, kHidden, kOut);
      copy_state(*model, *init);
      accelerator.prepare_model(model);
      // Stage 3 shards tandem::Sharded units only (this MLP has none): its
      // refusal is checked before the optimizer, which is what shards.
      if (stage == 2) {
        accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
            model->parameters(), torch::optim::SGDOptions(kLr)));
      }
      try {
        auto guard = accelerator.no_sync(model);
        ADD_FAILURE() << "no_sync was accepted under ZeRO stage " << stage;
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("stage " + std::to_string(stage)),
                  std::string::npos)
            << e.what();
      }
    });
  }
}

TEST(NoSyncErrors, RefusesAModelItDidNotPrepare) {
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp prepared(kIn, kHidden, kOut), other(kIn, kHidden, kOut);
    accelerator.prepare_model(prepared);
    EXPECT_THROW((void)accelerator.no_sync(other), UsageError);
  });
}

class ClipGradValue : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

// With loss scaling the gradients backward leaves are scaled by 2^16: the
// clamp must apply to the unscaled ones.
TEST_P(ClipGradValue, ClampsTheAveragedUnscaledGradientsReplicatedOrSharded) {
  const auto [world, stage, loss_scaling] = GetParam();
  const Mlp init = reference_init();
  const Dataset data = make_dataset(world * kBatch);
  at::Tensor mean;
  for (int r = 0; r < world; ++r) {
    at::Tensor g = local_grad(init, rows(data.x, world, r, 0), rows(data.y, world, r, 0));
    mean = r == 0 ? g : mean + g;
  }
  mean = mean / world;
  // A bound that clamps some elements and leaves others alone.
  const double clip = mean.abs().median().item<double>();
  ASSERT_GT(clip, 0);
  const at::Tensor expected = flat_params(*init) - kLr * mean.clamp(-clip, clip);

  run_ranks(world, [&, world = world, stage = stage, loss_scaling = loss_scaling](ProcessGroup& pg) {
    AcceleratorOptions options;
    if (loss_scaling) options.loss_scaling = LossScaleConfig{};
    Accelerator accelerator(pg.shared_from_this(), config_for_stage(stage), options);
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(kLr)));
    const int r = pg.rank();
    accelerator.backward(torch::mse_loss(model->forward(rows(data.x, world, r, 0)),
                                         rows(data.y, world, r, 0)));
    if (loss_scaling) {
      ASSERT_GT(accelerator.loss_scale(), 1.0);
    }
    accelerator.clip_grad_value(clip);
    if (stage == 0) {
      EXPECT_TRUE(torch::allclose(flat_grads(*model), mean.clamp(-clip, clip), 1e-5, 1e-7));
    }
    optimizer->step();
    const at::Tensor params = flat_params(*model);
    EXPECT_TRUE(torch::allclose(params, expected, 1e-5, 1e-6))
        << "rank " << r << " stage " << stage << " max diff "
        << (params - expected).abs().max().item<double>();
    EXPECT_THROW(accelerator.clip_grad_value(0.0), UsageError);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsStagesScaling, ClipGradValue,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 2),
                                            ::testing::Bool()));

}  // namespace no_sync_test
}  // namespace tandem
