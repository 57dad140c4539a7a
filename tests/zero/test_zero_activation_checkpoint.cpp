// Activation checkpointing with ZeRO stage 3 (ranks as threads), with the
// checkpoint inside the Sharded unit (Sharded<CheckpointedImpl<Block>>) and
// around it (Checkpointed<ShardedImpl<Block>>): training ends with
// bit-identical parameters to stage 3 without checkpointing, on 2 and 3
// ranks, and a recomputed unit gathers no parameters that backward is done
// with. Also: end-of-backward callbacks queued inside a checkpoint's nested
// backward run at the end of the whole backward, and the memory saved on a
// deep model, measured with a counting CPU allocator.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>

#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>

#include "core/torch_internals.h"
#include "parallel/backward_callbacks.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "support/zero_test_models.h"
#include "tandem/parallel/activation_checkpoint.h"

namespace tandem {
// Named after the file: its helpers share a unity batch with other areas'.
namespace zero_activation_checkpoint {
namespace {

using testing::BlockImpl;
using testing::run_ranks;

// input -> depth x Block -> output; Block is Sharded, Checkpointed or both.
template <typename Block>
struct CheckpointStackImpl : torch::nn::Module {
  CheckpointStackImpl(int in, int width, int out, int depth) {
    input = register_module("input", torch::nn::Linear(in, width));
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Block(width)));
    }
    output = register_module("output", torch::nn::Linear(width, out));
  }
  // `after_first` sees the first block's output (to hook it).
  torch::Tensor forward(torch::Tensor x, const std::function<void(torch::Tensor&)>& after_first) {
    x = input(x);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      x = blocks[i]->forward(x);
      if (i == 0 && after_first) after_first(x);
    }
    return output(x);
  }
  torch::nn::Linear input{nullptr}, output{nullptr};
  std::vector<Block> blocks;
};

enum class Placement { kNone, kInsideUnit, kAroundUnit };

using CkptParams = std::map<std::string, torch::Tensor>;
constexpr int kCkptDepth = 3;

template <typename Block>
CkptParams train_stage3(int world, bool checkpointing) {
  using Stack = torch::nn::ModuleHolder<CheckpointStackImpl<Block>>;
  std::vector<Stack> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(42);
    models.emplace_back(6, 16, 4, kCkptDepth);
    EXPECT_EQ(set_activation_checkpointing(*models.back(), checkpointing),
              checkpointing ? static_cast<std::size_t>(kCkptDepth) : 0u);
  }
  testing::Recipe recipe;
  std::vector<CkptParams> out(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    Stack& model = models[pg.rank()];
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-2));
    ZeroOptions options;
    options.stage = 3;
    ZeroOptimizer zero(model, adam, pg.shared_from_this(), options);
    // During the first block's backward, the units after it are done: a
    // recompute must not have gathered them again.
    std::string gathered_late;
    auto check_released = [&](torch::Tensor& x) {
      x.register_hook([&](const torch::Tensor&) {
        for (int b = 1; b < kCkptDepth; ++b) {
          if (model->blocks[b]->fc->weight.storage().nbytes() != 0) {
            gathered_late += "block" + std::to_string(b) + " ";
          }
        }
      });
    };
    for (int step = 0; step < 3; ++step) {
      zero.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        zero.set_gradient_sync(micro == 1);
        auto [x, y] = testing::micro_batch(recipe, step, micro, pg.rank(), pg.world_size());
        auto logits = model->forward(x, check_released);
        (torch::nn::functional::cross_entropy(logits, y) / 2).backward();
      }
      zero.step();
    }
    EXPECT_EQ(gathered_late, "") << "rank " << pg.rank();
    ZeroOptimizer::GatheredParameters whole(zero);
    for (const auto& item : model->named_parameters()) {
      out[pg.rank()][item.key()] = item.value().detach().clone();
    }
  });
  for (int r = 1; r < world; ++r) {
    for (const auto& [name, value] : out[0]) {
      EXPECT_TRUE(torch::equal(out[r].at(name), value)) << "rank " << r << " " << name;
    }
  }
  return out[0];
}

class CheckpointUnderZero3 : public ::testing::TestWithParam<std::tuple<Placement, int>> {};

TEST_P(CheckpointUnderZero3, TrainsToBitIdenticalParametersAndReleasesFinishedUnits) {
  const auto [placement, world] = GetParam();
  const CkptParams plain = train_stage3<Sharded<BlockImpl>>(world, false);
  const CkptParams got =
      placement == Placement::kInsideUnit
          ? train_stage3<Sharded<CheckpointedImpl<BlockImpl>>>(world, true)
          : train_stage3<Checkpointed<ShardedImpl<BlockImpl>>>(world, true);
  ASSERT_EQ(got.size(), plain.size());
  for (const auto& [name, value] : plain) {
    EXPECT_TRUE(torch::equal(got.at(name), value)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    PlacementsAndWorlds, CheckpointUnderZero3,
    ::testing::Combine(::testing::Values(Placement::kInsideUnit, Placement::kAroundUnit),
                       ::testing::Values(2, 3)),
    [](const ::testing::TestParamInfo<std::tuple<Placement, int>>& info) {
      return std::string(std::get<0>(info.param) == Placement::kInsideUnit ? "InsideUnit"
                                                                         : "AroundUnit") +
             "World" + std::to_string(std::get<1>(info.param));
    });

// --- Parameters with several gradients in one backward ----------------------

// A checkpointed block's backward is a pass of its own, so a parameter gets
// one gradient per pass: a block called twice per forward, or a weight tied
// across two checkpointed blocks. Each must reach the reduction, whatever
// the stage and however early the groups would launch.
template <typename Block>
struct ReuseImpl : torch::nn::Module {
  // `tie`: a parameter outside every block, used by two checkpointed calls.
  ReuseImpl(int width, int calls, bool tie) : calls(calls) {
    input = register_module("input", torch::nn::Linear(6, width));
    first = register_module("first", Block(width));
    if (tie) shared = register_parameter("shared", torch::randn({width, width}) * 0.3);
    output = register_module("output", torch::nn::Linear(width, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = input(x);
    for (int c = 0; c < calls; ++c) x = first->forward(x);
    if (shared.defined()) {
      const auto mix = [this](const torch::Tensor& h) { return h + torch::tanh(h.matmul(shared)); };
      for (int c = 0; c < 2; ++c) x = checkpointing ? tandem::checkpoint(mix, x) : mix(x);
    }
    return output(x);
  }
  int calls;
  bool checkpointing = false;
  torch::nn::Linear input{nullptr}, output{nullptr};
  Block first{nullptr};
  torch::Tensor shared;
};

// `calls(step)`: how often the first block runs in that step's forward.
template <typename Block>
CkptParams train_reuse(int world, int stage, bool checkpointing, bool tie,
                       const std::function<int(int)>& calls = [](int) { return 2; }) {
  using Model = torch::nn::ModuleHolder<ReuseImpl<Block>>;
  std::vector<Model> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(7);
    models.emplace_back(8, 2, tie);
    set_activation_checkpointing(*models.back(), checkpointing);
    models.back()->checkpointing = checkpointing;
  }
  testing::Recipe recipe;
  std::vector<CkptParams> out(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    Model& model = models[pg.rank()];
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
    ZeroOptions options;
    options.stage = stage;
    options.reduce_bucket_size = 1;  // every parameter its own group: they launch at once
    ZeroOptimizer zero(model, sgd, pg.shared_from_this(), options);
    for (int step = 0; step < 3; ++step) {
      model->calls = calls(step);
      zero.zero_grad();
      auto [x, y] = testing::micro_batch(recipe, step, 0, pg.rank(), pg.world_size());
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      zero.step();
    }
    ZeroOptimizer::GatheredParameters whole(zero);
    for (const auto& item : model->named_parameters()) {
      out[pg.rank()][item.key()] = item.value().detach().clone();
    }
  });
  return out[0];
}

class CheckpointedReuse : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(CheckpointedReuse, EveryPassesGradientIsReduced) {
  const auto [stage, world, tie] = GetParam();
  const auto run = [&](bool checkpointing) {
    return stage == 3
               ? train_reuse<Sharded<CheckpointedImpl<BlockImpl>>>(world, 3, checkpointing, tie)
               : train_reuse<Checkpointed<BlockImpl>>(world, stage, checkpointing, tie);
  };
  const CkptParams plain = run(false);
  const CkptParams got = run(true);
  ASSERT_EQ(got.size(), plain.size());
  for (const auto& [name, value] : plain) {
    EXPECT_TRUE(torch::allclose(got.at(name), value, 1e-6, 1e-7))
        << name << " off by " << (got.at(name) - value).abs().max().item<float>();
  }
}

INSTANTIATE_TEST_SUITE_P(
    StagesWorldsTies, CheckpointedReuse,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 3),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<int, int, bool>>& info) {
      return "Stage" + std::to_string(std::get<0>(info.param)) + "World" +
             std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "Tied" : "");
    });

// Fewer passes than counted reduce what came; more, after the group was
// reduced, is an error naming the parameter rather than a silent loss.
TEST(CheckpointedReuse, MorePassesThanCountedAreRefusedFewerAreReduced) {
  const auto calls = [](int step) { return step == 1 ? 1 : 2; };
  const CkptParams fewer_plain =
      train_reuse<Checkpointed<BlockImpl>>(2, 2, false, false, calls);
  const CkptParams fewer = train_reuse<Checkpointed<BlockImpl>>(2, 2, true, false, calls);
  for (const auto& [name, value] : fewer_plain) {
    EXPECT_TRUE(torch::allclose(fewer.at(name), value, 1e-6, 1e-7)) << name;
  }
  const std::string error = testing::usage_error_message([&] {
    train_reuse<Checkpointed<BlockImpl>>(1, 2, true, false,
                                         [](int step) { return step == 0 ? 2 : 3; });
  });
  EXPECT_NE(error.find("first.fc.weight (3 gradients, 2 counted)"), std::string::npos) << error;
  EXPECT_NE(error.find("call each checkpointed block the same number of times"),
            std::string::npos)
      << error;
}

// --- End-of-backward callbacks ---------------------------------------------

// What DDP's reducer and ZeRO rely on: a callback queued when the first
// gradient arrives, inside a checkpointed block's nested backward, runs after
// the gradients computed outside the block. Engine::queue_callback alone runs
// it when the nested pass ends, before them (the second half shows it).
TEST(ActivationCheckpointCallbacks, QueuedInsideTheNestedBackwardRunAtTheEndOfTheWhole) {
  auto run = [](bool tandem_queue) {
    std::vector<std::string> order;
    auto v = torch::ones({3}).requires_grad_(true);  // used before the block
    auto w = torch::ones({3}).requires_grad_(true);  // used inside it
    v.register_hook([&](const torch::Tensor&) { order.push_back("grad outside the block"); });
    w.register_hook([&](const torch::Tensor&) {
      auto callback = [&] { order.push_back("end-of-backward callback"); };
      if (tandem_queue) {
        detail::queue_end_of_backward(callback);
      } else {
        torch::autograd::Engine::get_default_engine().queue_callback(callback);
      }
    });
    auto h = torch::ones({3}) * v;
    checkpoint([&](const torch::Tensor& x) { return (x * w).sum(); }, h).backward();
    return order;
  };
  EXPECT_EQ(run(true),
            (std::vector<std::string>{"grad outside the block", "end-of-backward callback"}));
  EXPECT_EQ(run(false),
            (std::vector<std::string>{"end-of-backward callback", "grad outside the block"}));
}

// --- Memory -----------------------------------------------------------------

// A CPU allocator that counts the bytes live and their peak. Its state is
// never freed: tensors allocated through it may be freed at any time.
struct CountingAllocator {
  std::mutex mutex;
  std::unordered_map<void*, std::size_t> sizes;
  std::size_t live = 0, peak = 0;
};

CountingAllocator& counting_allocator() {
  static auto* state = new CountingAllocator;
  return *state;
}

void* counting_allocate(std::size_t nbytes) {
  void* ptr = nullptr;
  // c10's CPU allocator aligns to 64 bytes.
  if (posix_memalign(&ptr, 64, nbytes == 0 ? 1 : nbytes) != 0) throw std::bad_alloc();
  CountingAllocator& a = counting_allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.sizes[ptr] = nbytes;
  a.live += nbytes;
  a.peak = std::max(a.peak, a.live);
  return ptr;
}

void counting_free(void* ptr) {
  if (ptr == nullptr) return;
  {
    CountingAllocator& a = counting_allocator();
    std::lock_guard<std::mutex> lock(a.mutex);
    auto it = a.sizes.find(ptr);
    if (it != a.sizes.end()) {
      a.live -= it->second;
      a.sizes.erase(it);
    }
  }
  std::free(ptr);
}

struct DeepMlpImpl : torch::nn::Module {
  DeepMlpImpl(int width, int depth) {
    for (int i = 0; i < depth; ++i) {
      auto block = Checkpointed<torch::nn::SequentialImpl>(
          torch::nn::Linear(width, width), torch::nn::GELU(), torch::nn::Linear(width, width),
          torch::nn::GELU());
      blocks.push_back(register_module("block" + std::to_string(i), block));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block->forward(x);
    return x;
  }
  std::vector<Checkpointed<torch::nn::SequentialImpl>> blocks;
};
TORCH_MODULE(DeepMlp);

// Peak bytes allocated on the CPU by one forward and backward of the model
// (parameters and the input exist before; gradients count).
std::size_t peak_bytes_of_step(DeepMlp& model, const torch::Tensor& x) {
  CountingAllocator& a = counting_allocator();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    a.peak = a.live;
  }
  std::size_t start = 0;
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    start = a.live;
  }
  model->forward(x).pow(2).mean().backward();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.peak - start;
}

TEST(ActivationCheckpointMemory, PeakMemoryOfADeepMlpStepIsLower) {
  constexpr int kWidth = 256, kDepth = 16, kBatch = 1024;
  torch::manual_seed(0);
  DeepMlp model(kWidth, kDepth);
  auto x = torch::randn({kBatch, kWidth});
  auto installed = internals::install_cpu_allocator({&counting_allocate, &counting_free});
  set_activation_checkpointing(*model, false);
  const std::size_t plain = peak_bytes_of_step(model, x);
  model->zero_grad(/*set_to_none=*/true);
  set_activation_checkpointing(*model, true);
  const std::size_t checkpointed = peak_bytes_of_step(model, x);
  model->zero_grad(/*set_to_none=*/true);
  internals::restore_cpu_allocator(installed);
  const double mib = 1024.0 * 1024.0;
  std::printf("[ memory ] deep MLP (%d x 2 Linear(%d), batch %d), peak bytes of one forward and "
              "backward: %zu (%.1f MiB) without checkpointing, %zu (%.1f MiB) with\n",
              kDepth, kWidth, kBatch, plain, static_cast<double>(plain) / mib, checkpointed,
              static_cast<double>(checkpointed) / mib);
  RecordProperty("peak_bytes_plain", std::to_string(plain));
  RecordProperty("peak_bytes_checkpointed", std::to_string(checkpointed));
  // Activations (1 MiB per saved tensor, 3 per block) dominate without
  // checkpointing; with it, one input per block remains: well under 60%.
  EXPECT_LT(static_cast<double>(checkpointed), 0.6 * static_cast<double>(plain));
  // Both include the 16 x 2 weight gradients, so neither is tiny.
  EXPECT_GT(checkpointed, static_cast<std::size_t>(kDepth) * 2 * kWidth * kWidth * 4);
}

}  // namespace
}  // namespace zero_activation_checkpoint
}  // namespace tandem
