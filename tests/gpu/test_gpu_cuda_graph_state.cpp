// Whole-step CUDA graphs when the state around them changes, against the
// eager step on the same GPU (a two-layer model, fp32, AdamW, clipping):
// a load_state() in the middle of a captured run makes the graphs stale, and
// the run captures again and trains as the eager run does (with and without
// accumulation); an eager step taken by hand after captured ones starts from
// fresh gradients; a gradient from a backward by hand that a replay would
// drop, and a parameter the eager steps trained that gets no gradient in the
// captured step, are refused.

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpu/gpu_testing.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using testing::run_ranks;

struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    body = register_module("body", torch::nn::Linear(16, 32));
    a = register_module("a", torch::nn::Linear(32, 1));
    b = register_module("b", torch::nn::Linear(32, 1));
  }
  at::Tensor forward(const at::Tensor& x, bool use_b) {
    auto h = torch::tanh(body(x));
    return use_b ? a(h) + b(h) : a(h);
  }
  torch::nn::Linear body{nullptr}, a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoHeads);

struct ReloadRun {
  std::vector<double> losses;
  std::vector<at::Tensor> params;  // on the host, after the run
  int64_t captures_before_load = 0, captures = 0;
};

Config graph_config(bool graph, int64_t accumulation) {
  Config config;
  config.cuda_graph.enabled = graph;
  config.cuda_graph.warmup_steps = 2;
  config.gradient_accumulation_steps = accumulation;
  config.gradient_clipping = 1.0;
  return config;
}

// Calls body(accelerator, model, optimizer, step) on one rank with a fresh
// seeded model; returns the model's parameters afterwards.
using Body = std::function<void(Accelerator&, TwoHeads&, std::shared_ptr<AcceleratedOptimizer>&,
                                TrainStep&)>;
std::vector<at::Tensor> with_model(const Config& config, const bool* use_b, const Body& body) {
  std::vector<at::Tensor> params;
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    torch::manual_seed(3);
    TwoHeads model;
    auto adamw = std::make_shared<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adamw);
    auto step = accelerator.train_step(optimizer, [&](const std::vector<at::Tensor>& b) {
      return torch::mse_loss(model->forward(b[0], *use_b), b[1]);
    });
    body(accelerator, model, optimizer, step);
    for (const auto& p : model->parameters()) params.push_back(p.detach().cpu().clone());
  });
  return params;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 * std::abs(want[i]) + 1e-9) << what << " " << i;
  }
}

void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-6, 1e-7))
        << "parameter " << i << ": largest difference "
        << (got[i] - want[i]).abs().max().item<double>();
  }
}

// 6 optimizer steps, save_state, 4 steps, load_state, the same 4 steps again,
// then 4 more.
ReloadRun train_with_reload(bool graph, int64_t accumulation, const std::string& dir) {
  ReloadRun run;
  const bool use_b = true;
  torch::manual_seed(5);
  const auto xs = torch::randn({14 * accumulation, 8, 16});
  const auto ys = torch::randn({14 * accumulation, 8, 1});
  run.params = with_model(
      graph_config(graph, accumulation), &use_b,
      [&](Accelerator& accelerator, TwoHeads&, std::shared_ptr<AcceleratedOptimizer>&,
          TrainStep& step) {
        auto feed = [&](int64_t first, int64_t steps) {
          for (int64_t i = first * accumulation; i < (first + steps) * accumulation; ++i) {
            run.losses.push_back(step({xs[i], ys[i]}).item<double>());
          }
        };
        feed(0, 6);
        accelerator.save_state(dir);
        feed(6, 4);
        run.captures_before_load = step.captures();
        accelerator.load_state(dir);
        feed(6, 4);
        feed(10, 4);
        run.captures = step.captures();
      });
  return run;
}

class GpuCudaGraphState : public ::testing::TestWithParam<int64_t> {};

TEST_P(GpuCudaGraphState, ALoadStateMidRunCapturesAgainAndTrainsAsEager) {
  TANDEM_REQUIRE_CUDA();
  const int64_t accumulation = GetParam();
  testing::ScratchDir eager_dir, graph_dir;
  const ReloadRun eager = train_with_reload(false, accumulation, eager_dir.path());
  const ReloadRun graph = train_with_reload(true, accumulation, graph_dir.path());
  EXPECT_EQ(eager.captures, 0);
  EXPECT_GT(graph.captures_before_load, 0);
  EXPECT_GT(graph.captures, graph.captures_before_load)
      << "load_state replaced the optimizer's state: the graphs must be captured again";
  expect_close(graph.losses, eager.losses, "loss");
  expect_close(graph.params, eager.params);
  // The reload took effect: the 4 steps after it repeat the 4 before it.
  const auto per = static_cast<std::ptrdiff_t>(accumulation);
  for (const ReloadRun* r : {&eager, &graph}) {
    expect_close(std::vector<double>(r->losses.begin() + 10 * per, r->losses.begin() + 14 * per),
                 std::vector<double>(r->losses.begin() + 6 * per, r->losses.begin() + 10 * per),
                 r == &graph ? "graph, repeated steps" : "eager, repeated steps");
  }
  testing::record_gpu_figures(
      "cuda_graph_load_state_accumulation_" + std::to_string(accumulation),
      {{"captures_before_load", graph.captures_before_load}, {"captures", graph.captures}});
}

INSTANTIATE_TEST_SUITE_P(Accumulation, GpuCudaGraphState, ::testing::Values(1, 2));

// Captured steps, then eager ones by hand (zero_grad, backward, step): the
// eager backward must not add to the gradients the captured step left.
TEST(GpuCudaGraphStateEager, AnEagerStepAfterCapturedOnesStartsFromFreshGradients) {
  TANDEM_REQUIRE_CUDA();
  const bool use_b = true;
  torch::manual_seed(6);
  const auto xs = torch::randn({8, 8, 16}), ys = torch::randn({8, 8, 1});
  auto train = [&](bool graph) {
    int64_t captures = 0;
    auto params = with_model(
        graph_config(graph, 1), &use_b,
        [&](Accelerator& accelerator, TwoHeads& model, std::shared_ptr<AcceleratedOptimizer>& opt,
            TrainStep& step) {
          for (int64_t i = 0; i < 6; ++i) step({xs[i], ys[i]});
          captures = step.captures();
          for (int64_t i = 6; i < 8; ++i) {
            opt->zero_grad();
            auto x = xs[i].to(accelerator.device()), y = ys[i].to(accelerator.device());
            accelerator.backward(torch::mse_loss(model->forward(x, use_b), y));
            opt->step();
          }
        });
    return std::make_pair(params, captures);
  };
  const auto eager = train(false);
  const auto graph = train(true);
  EXPECT_EQ(graph.second, 1);
  expect_close(graph.first, eager.first);
}

// Without accumulation: a backward by hand between captured steps, not
// zeroed, would be dropped by the next replay (an eager step adds it in):
// refused, then accepted once zero_grad() cleared it.
TEST(GpuCudaGraphRefusals, AGradientFromABackwardOutsideTheCapturedStepIsRefused) {
  TANDEM_REQUIRE_CUDA();
  const bool use_b = true;
  torch::manual_seed(8);
  const auto xs = torch::randn({8, 8, 16}), ys = torch::randn({8, 8, 1});
  std::string message;
  int64_t replayed_after = -1;
  with_model(graph_config(true, 1), &use_b,
             [&](Accelerator& accelerator, TwoHeads& model,
                 std::shared_ptr<AcceleratedOptimizer>& opt, TrainStep& step) {
               for (int64_t i = 0; i < 4; ++i) step({xs[i], ys[i]});
               auto x = xs[4].to(accelerator.device()), y = ys[4].to(accelerator.device());
               accelerator.backward(torch::mse_loss(model->forward(x, use_b), y));
               try {
                 step({xs[5], ys[5]});
               } catch (const UsageError& e) {
                 message = e.what();
               }
               opt->step();
               opt->zero_grad();
               step({xs[6], ys[6]});
               replayed_after = step.graphed() ? 1 : 0;
             });
  EXPECT_NE(message.find("holds a gradient from a backward outside the captured step"),
            std::string::npos)
      << message;
  EXPECT_EQ(replayed_after, 1) << "after zero_grad() the captured step runs again";
}

// Eager warm-up steps train both heads; the captured step reads one.
std::string unused_head_refusal(int64_t accumulation) {
  bool use_b = true;
  std::string message;
  torch::manual_seed(7);
  const auto xs = torch::randn({8 * accumulation, 8, 16});
  const auto ys = torch::randn({8 * accumulation, 8, 1});
  with_model(graph_config(true, accumulation), &use_b,
             [&](Accelerator&, TwoHeads&, std::shared_ptr<AcceleratedOptimizer>&,
                 TrainStep& step) {
               int64_t i = 0;
               for (; i < 2 * accumulation; ++i) step({xs[i], ys[i]});  // the warm-up
               use_b = false;
               try {
                 for (; i < 8 * accumulation; ++i) step({xs[i], ys[i]});
               } catch (const UsageError& e) {
                 message = e.what();
               }
             });
  return message;
}

TEST(GpuCudaGraphRefusals, AParameterWithoutAGradientInTheCapturedStepIsRefused) {
  TANDEM_REQUIRE_CUDA();
  for (int64_t accumulation : {1, 2}) {
    SCOPED_TRACE("accumulation " + std::to_string(accumulation));
    const std::string message = unused_head_refusal(accumulation);
    EXPECT_NE(message.find("got no gradient in the captured step"), std::string::npos)
        << message;
    EXPECT_NE(message.find("must train the same parameters every time"), std::string::npos)
        << message;
    EXPECT_EQ(message.find("must not read tensors back"), std::string::npos)
        << "tandem's own refusal, not the capture-failure advice: " << message;
  }
}

}  // namespace
}  // namespace tandem
