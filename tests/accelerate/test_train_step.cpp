// Accelerator::train_step: the eager step trains exactly like the
// hand-written loop (accumulation, clipping, AdamW, 1 and 2 ranks), and the
// CUDA-graph option is refused on a CPU run with the reason and the remedy.
// The captured step's parity with eager runs on a GPU
// (tests/gpu/test_gpu_cuda_graph.cpp).

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::copy_state;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::make_dataset;
using testing::max_relative_diff;
using testing::Mlp;
using testing::reference_init;
using testing::run_ranks;

Config training_config(int64_t accumulation, double clipping) {
  Config config;
  config.gradient_accumulation_steps = accumulation;
  config.gradient_clipping = clipping;
  return config;
}

// The same loop written out: prepare, then per micro-batch backward, step
// and zero_grad, as the README's diff shows it.
Mlp train_by_hand(ProcessGroup& pg, const Mlp& init, const testing::Dataset& data,
                  int64_t accumulation, double clipping, bool with_step) {
  Accelerator accelerator(pg.shared_from_this(), training_config(accumulation, clipping));
  Mlp model(kIn, kHidden, kOut);
  copy_state(*model, *init);
  auto adamw = std::make_shared<torch::optim::AdamW>(
      model->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  DistributedLoaderOptions options;
  options.batch_size = 4;
  options.shuffle = false;
  auto [optimizer, loader] = accelerator.prepare(model, adamw, {data.x, data.y}, options);
  auto loss_of = [&](const std::vector<at::Tensor>& b) {
    return torch::mse_loss(model->forward(b[0]), b[1]);
  };
  TrainStep step = accelerator.train_step(optimizer, loss_of);
  for (auto& batch : *loader) {
    if (with_step) {
      at::Tensor loss = step({batch[0], batch[1]});
      EXPECT_FALSE(loss.requires_grad());
      EXPECT_FALSE(step.graphed());
    } else {
      accelerator.backward(loss_of({batch[0], batch[1]}));
      optimizer->step();
      optimizer->zero_grad();
    }
  }
  EXPECT_EQ(step.captures(), 0);
  return model;
}

class TrainStepParity : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(TrainStepParity, EagerStepEqualsTheHandWrittenLoop) {
  const Mlp init = reference_init();
  const auto [world, accumulation] = GetParam();
  const auto data = make_dataset(world * 4 * accumulation * 5);
  run_ranks(world, [&, accumulation = accumulation](ProcessGroup& pg) {
    // Clipping at 0.05 clips every step of this model (norms ~0.3-1).
    Mlp by_hand = train_by_hand(pg, init, data, accumulation, 0.05, false);
    Mlp by_step = train_by_hand(pg, init, data, accumulation, 0.05, true);
    EXPECT_EQ(max_relative_diff(*by_step, *by_hand), 0.0);
    EXPECT_GT(max_relative_diff(*by_step, *init), 1e-3) << "it trained";
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndAccumulation, TrainStepParity,
                         ::testing::Values(std::make_tuple(1, int64_t{1}),
                                           std::make_tuple(1, int64_t{3}),
                                           std::make_tuple(2, int64_t{2}),
                                           std::make_tuple(3, int64_t{1})));

// zero_grad() sets gradients to None without DDP (the next backward adopts
// its gradients, as in PyTorch) and zeroes them in place under DDP, whose
// .grad tensors are views of its buckets.
TEST(TrainStep, ZeroGradSetsNoneWithoutDdpAndZeroesInPlaceUnderDdp) {
  for (int world : {1, 2}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      Accelerator accelerator(pg.shared_from_this(), Config{});
      Mlp model(kIn, kHidden, kOut);
      auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                     torch::optim::SGDOptions(0.1));
      accelerator.prepare_model(model);
      auto optimizer = accelerator.prepare_optimizer(sgd);
      accelerator.backward(model->forward(torch::ones({2, kIn})).sum());
      optimizer->step();
      optimizer->zero_grad();
      for (const auto& p : model->parameters()) {
        if (world == 1) {
          EXPECT_FALSE(p.grad().defined());
        } else {
          ASSERT_TRUE(p.grad().defined());
          EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
        }
      }
    });
  }
}

std::string refusal(const Config& config) {
  std::string message;
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    Mlp model(kIn, kHidden, kOut);
    auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                       torch::optim::AdamWOptions(0.01));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adamw);
    try {
      accelerator.train_step(optimizer, [&](const std::vector<at::Tensor>& b) {
        return model->forward(b[0]).sum();
      });
    } catch (const UsageError& e) {
      message = e.what();
    }
  });
  return message;
}

TEST(TrainStep, CudaGraphOnACpuRunIsRefusedWithTheReason) {
  Config config;
  config.cuda_graph.enabled = true;
  const std::string message = refusal(config);
  EXPECT_NE(message.find("cuda_graph: the Accelerator runs on cpu"), std::string::npos) << message;
  EXPECT_NE(message.find("Turn cuda_graph off for CPU runs"), std::string::npos) << message;
}

TEST(TrainStep, CudaGraphSettingsBelowOneAreRefused) {
  Config config;
  config.cuda_graph.enabled = true;
  config.cuda_graph.warmup_steps = 0;
  EXPECT_NE(refusal(config).find("warmup_steps (0) and max_captures (4) must be at least 1"),
            std::string::npos);
}

TEST(TrainStep, EagerStepIsTheDefaultAndNeedsNoGpu) {
  EXPECT_EQ(refusal(Config{}), "");
}

}  // namespace
}  // namespace tandem
