// Whole-step CUDA graphs (Accelerator::train_step with cuda_graph enabled)
// against the eager step on the same GPU: the tiny GPT-2 of examples/gpt2
// trained 100 steps each way from the same weights and batches. fp32 losses
// agree within 1e-6 relative (the captured update reads the learning rate
// from an fp32 tensor, the eager one from a double); bf16 and fp16 within
// 1e-3, and the steps that came out bit-equal are counted in the figures.
// Under fp16 the loss scale after every step and the skipped steps must be
// the eager run's exactly (the scaler starts at 2^24 and grows every 10
// steps, so that steps overflow). Two cases take tandem's fused
// cross-entropy and LayerNorm (their CUDA kernels inside the capture), and
// one check trains with them against LibTorch's ops. Then the refusals a GPU run can reach: a host
// read inside the captured step, and more batch shapes than max_captures.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "../../examples/gpt2/gpt2_model.h"
#include "gpu/gpu_testing.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/amp/cross_entropy.h"
#include "tandem/amp/fused_layer_norm.h"
#include "tandem/optim/lr_scheduler.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;

struct TrainedRun {
  std::vector<double> losses;
  std::vector<double> scales;  // the loss scale after each optimizer step
  int64_t skipped = 0;
  int64_t captures = 0;
  bool replayed = false;
  double ms_per_step = 0;
};

gpt2::Gpt2Config tiny() { return gpt2::preset("tiny"); }

// 100 optimizer steps of the tiny GPT-2 on batches drawn from a fixed seed.
// fused: tandem::fused_cross_entropy, and tandem::fused_add_layer_norm for
// the residual adds with their LayerNorms (their CUDA kernels, captured
// with the rest) instead of LibTorch's loss, adds and LayerNorm.
TrainedRun train(bool graph, MixedPrecision precision, int64_t accumulation, bool fused = false,
                 int64_t steps = 100) {
  TrainedRun run;
  run_ranks(1, [&](ProcessGroup& pg) {
    Config config;
    config.mixed_precision = precision;
    config.gradient_accumulation_steps = accumulation;
    config.gradient_clipping = 1.0;
    config.cuda_graph.enabled = graph;
    // fp16: start high and grow often, so that 100 steps overflow and skip.
    config.fp16.initial_scale_power = 24;
    config.fp16.loss_scale_window = 10;
    Accelerator accelerator(pg.shared_from_this(), config);
    torch::manual_seed(7);
    gpt2::Gpt2Config shape = tiny();
    shape.fused_layer_norm = fused;
    shape.fused_residual_add = fused;
    gpt2::Gpt2 model(shape);
    auto adamw = std::make_shared<torch::optim::AdamW>(
        model->parameters(),
        torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adamw);
    WarmupCosineLROptions schedule;
    schedule.total_num_steps = steps;
    schedule.warmup_num_steps = 10;
    auto scheduler =
        accelerator.prepare_scheduler(std::make_shared<WarmupCosineLR>(*optimizer, schedule));
    const int64_t vocab = tiny().vocab_size, t = tiny().block_size;
    auto step = accelerator.train_step(optimizer, [&](const std::vector<at::Tensor>& b) {
      auto logits = model->forward(b[0]).view({-1, vocab});
      return fused ? fused_cross_entropy(logits, b[1].view({-1}))
                   : torch::nn::functional::cross_entropy(logits, b[1].view({-1}));
    });
    torch::manual_seed(11);
    const auto tokens = torch::randint(vocab, {steps * accumulation, 16, t + 1}, torch::kLong);
    std::vector<at::Tensor> losses;
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps * accumulation; ++i) {
      auto sequence = tokens[i];
      losses.push_back(step({sequence.narrow(1, 0, t), sequence.narrow(1, 1, t)}));
      if ((i + 1) % accumulation == 0) {
        scheduler->step();
        run.scales.push_back(accelerator.loss_scale());
      }
    }
    torch::cuda::synchronize();
    run.ms_per_step =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        static_cast<double>(steps);
    run.skipped = accelerator.skipped_steps();
    EXPECT_EQ(accelerator.step() + run.skipped, steps);
    auto all = torch::stack(losses).to(torch::kDouble).cpu();
    run.losses.assign(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
    run.captures = step.captures();
    run.replayed = step.graphed();
  });
  return run;
}

// The fused loss and LayerNorm against LibTorch's, eager, bf16: the same
// training within bf16's noise (the losses of its first steps within 1e-3
// relative, all 100 within 2e-2), since only last roundings differ.
TEST(GpuFusedOps, TrainTheTinyGpt2LikeLibTorchsOps) {
  TANDEM_REQUIRE_CUDA();
  const TrainedRun aten = train(false, MixedPrecision::kBf16, 1, false);
  const TrainedRun fused = train(false, MixedPrecision::kBf16, 1, true);
  ASSERT_EQ(aten.losses.size(), fused.losses.size());
  double worst = 0, worst_first10 = 0;
  for (std::size_t i = 0; i < aten.losses.size(); ++i) {
    const double diff = std::abs(fused.losses[i] - aten.losses[i]) / std::abs(aten.losses[i]);
    worst = std::max(worst, diff);
    if (i < 10) worst_first10 = std::max(worst_first10, diff);
  }
  EXPECT_LT(worst_first10, 1e-3);
  EXPECT_LT(worst, 2e-2);
  EXPECT_LT(fused.losses.back(), fused.losses.front()) << "it trained";
  testing::record_gpu_figures("fused_ops_training",
                              {{"max_relative_loss_diff", worst},
                               {"max_relative_loss_diff_first_10", worst_first10},
                               {"aten_ms_per_step", aten.ms_per_step},
                               {"fused_ms_per_step", fused.ms_per_step},
                               {"last_loss_aten", aten.losses.back()},
                               {"last_loss_fused", fused.losses.back()}});
}

class GpuCudaGraph
    : public ::testing::TestWithParam<std::tuple<MixedPrecision, int64_t, double, bool>> {};

TEST_P(GpuCudaGraph, CapturedStepsTrainLikeEagerSteps) {
  TANDEM_REQUIRE_CUDA();
  const auto [precision, accumulation, tolerance, fused] = GetParam();
  const TrainedRun eager = train(false, precision, accumulation, fused);
  const TrainedRun graphed = train(true, precision, accumulation, fused);
  ASSERT_TRUE(graphed.replayed) << "the last steps should replay a graph";
  EXPECT_EQ(graphed.captures, accumulation > 1 ? 2 : 1);
  ASSERT_EQ(eager.losses.size(), graphed.losses.size());
  double worst = 0;
  int64_t bit_equal = 0;
  for (std::size_t i = 0; i < eager.losses.size(); ++i) {
    worst = std::max(worst, std::abs(graphed.losses[i] - eager.losses[i]) /
                                std::max(1e-12, std::abs(eager.losses[i])));
    bit_equal += graphed.losses[i] == eager.losses[i];
  }
  EXPECT_LT(worst, tolerance);
  EXPECT_EQ(graphed.scales, eager.scales) << "the loss scale, step by step";
  EXPECT_EQ(graphed.skipped, eager.skipped);
  if (precision == MixedPrecision::kFp16) {
    EXPECT_GE(eager.skipped, 3) << "overflows happened";
  }
  EXPECT_LT(eager.losses.back(), eager.losses.front()) << "it trained";
  testing::record_gpu_figures(
      std::string("cuda_graph_parity_") + to_string(precision) + "_accumulation" +
          std::to_string(accumulation) + (fused ? "_fused_ops" : ""),
      {{"max_relative_loss_diff", worst},
       {"bit_equal_losses", bit_equal},
       {"losses", static_cast<int64_t>(eager.losses.size())},
       {"eager_ms_per_step", eager.ms_per_step},
       {"graph_ms_per_step", graphed.ms_per_step},
       {"skipped_steps", eager.skipped},
       {"first_loss", eager.losses.front()},
       {"last_loss", eager.losses.back()}});
}

INSTANTIATE_TEST_SUITE_P(
    PrecisionsAndAccumulation, GpuCudaGraph,
    ::testing::Values(std::make_tuple(MixedPrecision::kNo, int64_t{1}, 1e-6, false),
                      std::make_tuple(MixedPrecision::kNo, int64_t{2}, 1e-6, false),
                      std::make_tuple(MixedPrecision::kBf16, int64_t{1}, 1e-3, false),
                      std::make_tuple(MixedPrecision::kFp16, int64_t{1}, 1e-3, false),
                      std::make_tuple(MixedPrecision::kFp16, int64_t{2}, 1e-3, false),
                      std::make_tuple(MixedPrecision::kBf16, int64_t{1}, 1e-3, true),
                      std::make_tuple(MixedPrecision::kFp16, int64_t{2}, 1e-3, true)));

// Refusals that need a GPU to reach.
std::string graph_error(const std::function<void(TrainStep&, Accelerator&)>& drive,
                        int64_t max_captures = 4,
                        const std::function<void(const at::Tensor&)>& inside = nullptr) {
  std::string message;
  run_ranks(1, [&](ProcessGroup& pg) {
    Config config;
    config.cuda_graph.enabled = true;
    config.cuda_graph.warmup_steps = 1;
    config.cuda_graph.max_captures = max_captures;
    Accelerator accelerator(pg.shared_from_this(), config);
    torch::nn::Linear model(8, 1);
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters(),
                                                     torch::optim::AdamOptions(1e-2));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    auto step = accelerator.train_step(optimizer, [&](const std::vector<at::Tensor>& b) {
      at::Tensor loss = model->forward(b[0]).pow(2).mean();
      if (inside) inside(loss);
      return loss;
    });
    try {
      drive(step, accelerator);
    } catch (const UsageError& e) {
      message = e.what();
    }
  });
  return message;
}

TEST(GpuCudaGraphRefusals, AHostReadInsideTheStepIsRefusedWithTheRemedy) {
  TANDEM_REQUIRE_CUDA();
  int calls = 0;
  const std::string message = graph_error(
      [](TrainStep& step, Accelerator&) {
        for (int i = 0; i < 3; ++i) step({torch::randn({4, 8})});
      },
      4, [&](const at::Tensor& loss) { (void)loss.item<double>(); ++calls; });
  EXPECT_NE(message.find("capturing the training step failed"), std::string::npos) << message;
  EXPECT_NE(message.find("must not read tensors back to the host"), std::string::npos) << message;
  // The warm-up step ran it eagerly; the capture stopped inside its read.
  EXPECT_EQ(calls, 1);
}

TEST(GpuCudaGraphRefusals, EachNewShapeCapturesOnceUpToMaxCaptures) {
  TANDEM_REQUIRE_CUDA();
  int64_t captures = 0;
  const std::string message = graph_error(
      [&](TrainStep& step, Accelerator&) {
        for (int64_t rows : {4, 4, 6, 4, 6}) step({torch::randn({rows, 8})});
        captures = step.captures();
        step({torch::randn({5, 8})});
      },
      2);
  EXPECT_EQ(captures, 2) << "shapes 4 and 6, once each";
  EXPECT_NE(message.find("a batch of a new shape"), std::string::npos) << message;
  EXPECT_NE(message.find("max_captures"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem
