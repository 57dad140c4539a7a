// tandem::checkpoint and Checkpointed<Impl> give what the same code gives
// without checkpointing, bit for bit on the CPU in fp32: the loss, the
// gradients of inputs and parameters, the dropout masks (recomputed from the
// saved generator state) and the random stream after backward; under bf16
// autocast too. And it refuses what it cannot do, instead of returning
// wrong gradients.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "parallel/checkpoint_test_models.h"
#include "tandem/amp/autocast.h"
#include "tandem/core/error.h"
#include "tandem/parallel/activation_checkpoint.h"

namespace tandem {
namespace {

using testing::bitwise_differences;
using testing::CheckpointNet;
using testing::gradients_of;

struct NetRun {
  torch::Tensor loss, input_grad, random_after;
  std::map<std::string, torch::Tensor> grads;
};

// One forward and backward of a fresh, identically initialised net with
// dropout 0.3, then 16 numbers from the global generator.
NetRun run_net(bool checkpointing) {
  torch::manual_seed(11);
  CheckpointNet net(6, 16, 3, /*depth=*/4, /*dropout=*/0.3);
  EXPECT_EQ(set_activation_checkpointing(*net, checkpointing), 5u);  // 4 blocks and the head
  auto x = torch::randn({8, 6}).requires_grad_(true);
  torch::manual_seed(7);  // the stream dropout draws from
  NetRun r;
  r.loss = net->forward(x).pow(2).mean();
  r.loss.backward();
  r.random_after = torch::rand({16});
  r.input_grad = x.grad().clone();
  r.grads = gradients_of(*net);
  return r;
}

TEST(ActivationCheckpoint, GradientsDropoutMasksAndTheRandomStreamAreBitwiseEqual) {
  const NetRun plain = run_net(false);
  const NetRun checkpointed = run_net(true);
  EXPECT_TRUE(torch::equal(checkpointed.loss, plain.loss));
  EXPECT_TRUE(torch::equal(checkpointed.input_grad, plain.input_grad));
  EXPECT_EQ(bitwise_differences(checkpointed.grads, plain.grads), "");
  EXPECT_TRUE(torch::equal(checkpointed.random_after, plain.random_after))
      << "the generator must continue as if nothing had been recomputed";
  for (const auto& [name, grad] : plain.grads) {
    ASSERT_TRUE(grad.defined()) << name;
    EXPECT_GT(grad.abs().sum().item<double>(), 0.0) << name;
  }
}

// The test above can fail: without the saved generator state the recompute
// draws other dropout masks, and the gradients differ.
TEST(ActivationCheckpoint, WithoutTheSavedGeneratorStateDropoutGradientsDiffer) {
  auto run = [](bool checkpointing, CheckpointOptions options) {
    torch::manual_seed(3);
    auto w = torch::randn({32, 32}).requires_grad_(true);
    auto x = torch::randn({4, 32});
    auto fn = [&](const torch::Tensor& h) {
      return torch::dropout(torch::matmul(h, w), 0.5, /*train=*/true);
    };
    auto y = checkpointing ? checkpoint(options, fn, x) : fn(x);
    y.pow(2).sum().backward();
    return w.grad().clone();
  };
  const auto plain = run(false, {});
  EXPECT_TRUE(torch::equal(run(true, {}), plain));
  CheckpointOptions no_rng;
  no_rng.preserve_rng_state = false;
  EXPECT_FALSE(torch::equal(run(true, no_rng), plain));
}

TEST(ActivationCheckpoint, MarkedBlocksArePlainUntilSwitchedOn) {
  torch::manual_seed(1);
  CheckpointNet net(4, 8, 2, 2, 0.0);
  for (auto& block : net->blocks) EXPECT_FALSE(block->checkpointing());
  EXPECT_EQ(set_activation_checkpointing(*net, true), 3u);
  for (auto& block : net->blocks) EXPECT_TRUE(block->checkpointing());
  EXPECT_TRUE(net->head->checkpointing());
  // A forward under checkpointing records one node per block, not the
  // block's ops: the output's grad_fn is the head's checkpoint node.
  auto y = net->forward(torch::randn({2, 4}));
  EXPECT_NE(y.grad_fn()->name().find("CheckpointFunctionNode"), std::string::npos)
      << y.grad_fn()->name();
  EXPECT_EQ(set_activation_checkpointing(*net, false), 3u);
  EXPECT_EQ(net->forward(torch::randn({2, 4})).grad_fn()->name().find("Checkpoint"),
            std::string::npos);
}

TEST(ActivationCheckpoint, ConfigBlockSwitchesMarkedBlocksOnAndOtherwiseLeavesThem) {
  torch::manual_seed(1);
  CheckpointNet net(4, 8, 2, 2, 0.0);
  ActivationCheckpointingConfig off;
  EXPECT_EQ(apply_activation_checkpointing(*net, off), 0u);
  EXPECT_FALSE(net->blocks[0]->checkpointing());
  ActivationCheckpointingConfig on;
  on.enabled = true;
  EXPECT_EQ(apply_activation_checkpointing(*net, on), 3u);
  EXPECT_TRUE(net->blocks[1]->checkpointing());
  EXPECT_EQ(apply_activation_checkpointing(*net, off), 0u);
  EXPECT_TRUE(net->blocks[1]->checkpointing()) << "off in the config leaves code's choice";
  torch::nn::Linear unmarked(2, 2);
  EXPECT_EQ(apply_activation_checkpointing(*unmarked, on), 0u);
}

TEST(ActivationCheckpoint, TupleOutputsNonTensorArgumentsAndUndefinedTensors) {
  torch::manual_seed(5);
  auto w = torch::randn({4, 4}).requires_grad_(true);
  auto a = torch::randn({3, 4}).requires_grad_(true);
  auto b = torch::randn({3, 4});  // needs no gradient
  auto fn = [&](const torch::Tensor& x, int64_t k, double scale, const torch::Tensor& none,
                const torch::Tensor& shift) {
    EXPECT_FALSE(none.defined());
    auto h = torch::matmul(x, w) * scale + shift;
    // A power, an integer output, and a float output that needs no gradient.
    return std::make_tuple(h.pow(k), h.argmax(1), h.detach() * 2);
  };
  auto loss_of = [](const std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>& out) {
    return std::get<0>(out).sum() + std::get<2>(out).sum();
  };
  auto plain = fn(a, 3, 0.5, torch::Tensor(), b);
  loss_of(plain).backward();
  auto w_grad = w.grad().clone(), a_grad = a.grad().clone();
  w.mutable_grad().reset();
  a.mutable_grad().reset();

  auto checkpointed = checkpoint(fn, a, int64_t{3}, 0.5, torch::Tensor(), b);
  EXPECT_TRUE(torch::equal(std::get<0>(checkpointed), std::get<0>(plain)));
  EXPECT_TRUE(torch::equal(std::get<1>(checkpointed), std::get<1>(plain)));
  EXPECT_FALSE(std::get<1>(checkpointed).requires_grad());
  loss_of(checkpointed).backward();
  EXPECT_TRUE(torch::equal(w.grad(), w_grad));
  EXPECT_TRUE(torch::equal(a.grad(), a_grad));
  EXPECT_FALSE(b.grad().defined());
}

TEST(ActivationCheckpoint, ParametersTrainWhenNoInputRequiresGrad) {
  torch::manual_seed(2);
  torch::nn::Linear layer(5, 5);
  auto x = torch::randn({2, 5});  // plain data into a first block
  auto fn = [&](const torch::Tensor& h) { return torch::tanh(layer(h)); };
  fn(x).sum().backward();
  auto expected = layer->weight.grad().clone();
  layer->zero_grad();
  checkpoint(fn, x).sum().backward();
  ASSERT_TRUE(layer->weight.grad().defined());
  EXPECT_TRUE(torch::equal(layer->weight.grad(), expected));
}

TEST(ActivationCheckpoint, NestedCheckpointsGiveTheSameGradients) {
  torch::manual_seed(4);
  auto w1 = torch::randn({6, 6}).requires_grad_(true);
  auto w2 = torch::randn({6, 6}).requires_grad_(true);
  auto x = torch::randn({3, 6}).requires_grad_(true);
  auto inner = [&](const torch::Tensor& h) { return torch::tanh(torch::matmul(h, w1)); };
  auto outer = [&](bool nest) {
    return [&, nest](const torch::Tensor& h) {
      auto mid = nest ? checkpoint(inner, h) : inner(h);
      return torch::sigmoid(torch::matmul(mid, w2));
    };
  };
  outer(false)(x).sum().backward();
  auto expected = std::vector<torch::Tensor>{w1.grad().clone(), w2.grad().clone(), x.grad().clone()};
  for (auto* t : {&w1, &w2, &x}) t->mutable_grad().reset();
  checkpoint(outer(true), x).sum().backward();
  EXPECT_TRUE(torch::equal(w1.grad(), expected[0]));
  EXPECT_TRUE(torch::equal(w2.grad(), expected[1]));
  EXPECT_TRUE(torch::equal(x.grad(), expected[2]));
}

TEST(ActivationCheckpoint, RunsOnceWithoutGradAndTwiceWithBackward) {
  auto w = torch::ones({2}).requires_grad_(true);
  int calls = 0;
  auto fn = [&](const torch::Tensor& h) {
    ++calls;
    return h * w;
  };
  {
    torch::NoGradGuard no_grad;
    auto y = checkpoint(fn, torch::ones({2}));
    EXPECT_EQ(calls, 1);
    EXPECT_FALSE(y.requires_grad());
  }
  calls = 0;
  auto y = checkpoint(fn, torch::ones({2}));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(torch::equal(w.grad(), torch::ones({2})));
}

TEST(ActivationCheckpoint, RecomputesUnderTheForwardsAutocastState) {
  // Backward runs outside the autocast guard; the recompute must still run
  // in bf16, or its gradients would be fp32 ones and differ.
  auto run = [](bool checkpointing) {
    torch::manual_seed(9);
    CheckpointNet net(6, 16, 3, 3, 0.0);
    set_activation_checkpointing(*net, checkpointing);
    auto x = torch::randn({8, 6});
    torch::Tensor loss, logits;
    {
      AutocastGuard autocast(c10::DeviceType::CPU, MixedPrecision::kBf16);
      logits = net->forward(x);
      loss = to_fp32(logits).pow(2).mean();
    }
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    loss.backward();
    return std::make_pair(loss, gradients_of(*net));
  };
  auto [plain_loss, plain] = run(false);
  auto [loss, grads] = run(true);
  EXPECT_TRUE(torch::equal(loss, plain_loss));
  EXPECT_EQ(bitwise_differences(grads, plain), "");
  EXPECT_FALSE(is_autocast_enabled(c10::DeviceType::CPU)) << "the recompute's state leaked";
}

TEST(ActivationCheckpoint, AutogradGradIsRefusedWithAClearError) {
  auto w = torch::ones({3}).requires_grad_(true);
  auto x = torch::ones({3}).requires_grad_(true);
  auto y = checkpoint([&](const torch::Tensor& h) { return (h * w).sum(); }, x);
  try {
    torch::autograd::grad({y}, {x});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("torch::autograd::grad()"), std::string::npos)
        << e.what();
  }
}

TEST(ActivationCheckpoint, ARecomputeThatReturnsOtherTensorsIsRefused) {
  auto w = torch::ones({3}).requires_grad_(true);
  int calls = 0;
  auto fn = [&](const torch::Tensor& h) {
    std::vector<torch::Tensor> out{h * w};
    if (++calls > 1) out.push_back(h * 2);
    return out;
  };
  auto y = checkpoint(fn, torch::ones({3}));
  try {
    y[0].sum().backward();
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("must return the same tensors"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem
