// ZeRO-3 on a model with no tandem::Sharded unit: the auto-wrap policies
// (FSDP's size and transformer-layer policies at the elements of a
// torch::nn::Sequential) and the root as one unit train like DDP at worlds 2
// and 3; each policy's parameter memory per rank is reported and checked
// against what it shards. Also the policies' refusals.

#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <tuple>

#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "support/zero_test_models.h"
#include "tandem/zero/auto_wrap.h"

namespace tandem {
namespace {

using testing::Params;
using testing::run_ranks;

struct WrapLayerImpl : torch::nn::Module {
  explicit WrapLayerImpl(int width) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc = register_module("fc", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(fc(norm(x))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(WrapLayer);

constexpr int kWrapIn = 7, kWrapWidth = 13, kWrapOut = 5, kWrapLayers = 3;

// in -> Linear -> WrapLayer x 3 -> Linear -> out, as one Sequential: the
// plain LibTorch model a port brings, with odd sizes.
torch::nn::Sequential make_sequential_model() {
  std::lock_guard<std::mutex> lock(testing::init_mutex());
  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(kWrapIn, kWrapWidth));
  for (int i = 0; i < kWrapLayers; ++i) model->push_back(WrapLayer(kWrapWidth));
  model->push_back(torch::nn::Linear(kWrapWidth, kWrapOut));
  return model;
}

int64_t wrap_model_bytes() {
  int64_t n = 0;
  for (const auto& p : make_sequential_model()->parameters()) n += p.numel() * 4;
  return n;
}

testing::Recipe auto_wrap_recipe() {
  testing::Recipe r;
  r.in = kWrapIn;
  r.out = kWrapOut;
  r.global_batch = 12;  // divisible by 2 and 3 ranks
  return r;
}

// One AdamW training run (with accumulation and clipping): DDP when
// `zero` is empty, else ZeRO-3 with those options. Returns rank 0's
// parameters; `stats` gets rank 0's memory after the last step.
Params train_auto_wrap(int world, const std::optional<ZeroOptions>& zero, ZeroMemoryStats* stats = nullptr,
             std::vector<std::string>* units = nullptr) {
  const testing::Recipe r = auto_wrap_recipe();
  Params out;
  std::mutex mutex;
  run_ranks(world, [&](ProcessGroup& pg) {
    torch::nn::Sequential model = make_sequential_model();
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-2));
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<ZeroOptimizer> sharded;
    if (zero) {
      sharded = std::make_unique<ZeroOptimizer>(model, adamw, pg.shared_from_this(), *zero);
    } else {
      ddp = std::make_unique<DistributedDataParallel>(model, pg.shared_from_this());
    }
    for (int step = 0; step < r.steps; ++step) {
      if (sharded) sharded->zero_grad(); else adamw.zero_grad();
      for (int micro = 0; micro < r.accumulation; ++micro) {
        if (ddp) ddp->set_gradient_sync(micro == r.accumulation - 1);
        auto [x, y] = testing::micro_batch(r, step, micro, pg.rank(), pg.world_size());
        (torch::nn::functional::cross_entropy(model->forward(x), y) / r.accumulation).backward();
      }
      if (sharded) {
        sharded->clip_grad_norm(r.clip);
        sharded->step();
      } else {
        torch::nn::utils::clip_grad_norm_(model->parameters(), r.clip);
        adamw.step();
      }
    }
    Params p;
    if (sharded) {
      const ZeroMemoryStats s = sharded->memory_stats();
      auto names = sharded->group_parameter_names();
      ZeroOptimizer::GatheredParameters whole(*sharded);
      p = testing::snapshot(*model);
      std::lock_guard<std::mutex> lock(mutex);
      if (pg.rank() == 0 && stats) *stats = s;
      if (pg.rank() == 0 && units) {
        units->clear();
        for (const auto& group : names) units->push_back(group.front());
      }
    } else {
      p = testing::snapshot(*model);
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() == 0) out = p;
  });
  return out;
}

ZeroOptions wrap_stage3(AutoWrapOptions::Policy policy) {
  ZeroOptions options;
  options.stage = 3;
  options.auto_wrap.policy = policy;
  options.auto_wrap.min_num_params = 200;  // the MlpLayers (208 each), not the Linears (104, 70)
  options.auto_wrap.layer_types = {"WrapLayer"};
  return options;
}

using AutoWrapCase = std::tuple<AutoWrapOptions::Policy, int /*world*/>;

const char* wrap_policy_label(AutoWrapOptions::Policy policy) {
  switch (policy) {
    case AutoWrapOptions::kNone: return "RootUnit";
    case AutoWrapOptions::kSize: return "SizePolicy";
    case AutoWrapOptions::kTransformerLayer: return "TransformerLayerPolicy";
  }
  return "?";
}

class ZeroAutoWrap : public ::testing::TestWithParam<AutoWrapCase> {};

TEST_P(ZeroAutoWrap, TrainsLikeDdpAndShardsWhatThePolicyWraps) {
  auto [policy, world] = GetParam();
  const Params expected = train_auto_wrap(world, std::nullopt);
  ZeroMemoryStats stats;
  std::vector<std::string> units;
  const Params got = train_auto_wrap(world, wrap_stage3(policy), &stats, &units);
  EXPECT_LT(testing::max_relative_diff(got, expected), 1e-5);
  const int64_t whole = wrap_model_bytes();
  // The figure the issue asks for: parameter memory per rank, per policy.
  std::printf("auto-wrap %s world %d: parameter_bytes %lld of %lld, peak gathered %lld\n",
              wrap_policy_label(policy), world, static_cast<long long>(stats.parameter_bytes),
              static_cast<long long>(whole),
              static_cast<long long>(stats.peak_gathered_parameter_bytes));
  if (policy == AutoWrapOptions::kNone) {
    EXPECT_EQ(stats.parameter_bytes, whole);  // FSDP's root unit: whole on every rank
    EXPECT_EQ(units.size(), 1u);              // one group: the loose parameters
  } else {
    // The three MlpLayers are units (first parameter of each group, in
    // launch order), then the two Linears stay whole (the loose group).
    EXPECT_EQ(units, (std::vector<std::string>{"3.norm.weight", "2.norm.weight", "1.norm.weight",
                                               "4.bias"}));
    const int64_t layer = (2 * kWrapWidth + kWrapWidth * kWrapWidth + kWrapWidth) * 4;
    const int64_t linears = whole - kWrapLayers * layer;
    EXPECT_LT(stats.parameter_bytes, linears + kWrapLayers * layer / world + kWrapLayers * 4 * world);
    // Whole units only while in use (the default prefetch may gather all
    // three ahead), never the Linears: they were never partitioned.
    EXPECT_GT(stats.peak_gathered_parameter_bytes, 0);
    EXPECT_LE(stats.peak_gathered_parameter_bytes, kWrapLayers * (layer + 4 * world));
  }
}

INSTANTIATE_TEST_SUITE_P(
    PoliciesWorlds, ZeroAutoWrap,
    ::testing::Combine(::testing::Values(AutoWrapOptions::kNone, AutoWrapOptions::kSize,
                                         AutoWrapOptions::kTransformerLayer),
                       ::testing::Values(2, 3)),
    [](const ::testing::TestParamInfo<AutoWrapCase>& info) {
      return std::string(wrap_policy_label(std::get<0>(info.param))) + "World" +
             std::to_string(std::get<1>(info.param));
    });

TEST(AutoWrap, WrapsOnceAndAWrappedModelComputesTheSame) {
  torch::nn::Sequential model = make_sequential_model();
  const auto x = torch::randn({4, kWrapIn});
  const auto before = model->forward(x);
  AutoWrapOptions options;
  options.policy = AutoWrapOptions::kTransformerLayer;
  options.layer_types = {"WrapLayerImpl"};
  EXPECT_EQ(auto_wrap(*model, options), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(auto_wrap(*model, options), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_TRUE(torch::equal(model->forward(x), before));
  // Names and parameters are the model's own.
  EXPECT_EQ(model->named_parameters().size(), make_sequential_model()->named_parameters().size());
  EXPECT_TRUE(model->named_parameters().contains("2.fc.weight"));
}

TEST(AutoWrap, ASizePolicyWrapsTheSmallestSequentialElementsOverTheSize) {
  torch::nn::Sequential model = make_sequential_model();
  AutoWrapOptions options;
  options.policy = AutoWrapOptions::kSize;
  options.min_num_params = 100;  // the first Linear (104) too, not the last (70)
  EXPECT_EQ(auto_wrap(*model, options), (std::vector<std::string>{"0", "1", "2", "3"}));
  // A nested Linear over the size is no Sequential element: its count goes
  // to its layer, which is wrapped whole.
  torch::nn::Sequential again = make_sequential_model();
  options.min_num_params = 150;  // WrapLayer.fc alone has 182
  EXPECT_EQ(auto_wrap(*again, options), (std::vector<std::string>{"1", "2", "3"}));
}

struct WrapDirectCallsImpl : torch::nn::Module {
  WrapDirectCallsImpl() { layer = register_module("layer", WrapLayer(kWrapWidth)); }
  torch::Tensor forward(torch::Tensor x) { return layer(x); }
  WrapLayer layer{nullptr};
};
TORCH_MODULE(WrapDirectCalls);

TEST(AutoWrap, ALayerNoSequentialCallsIsRefusedNamingTheWayToDeclareIt) {
  WrapDirectCalls model;
  AutoWrapOptions options;
  options.policy = AutoWrapOptions::kTransformerLayer;
  options.layer_types = {"WrapLayer"};
  const std::string message = testing::usage_error_message([&] { auto_wrap(*model, options); });
  EXPECT_NE(message.find("'layer'"), std::string::npos) << message;
  EXPECT_NE(message.find("tandem::Sharded<"), std::string::npos) << message;
  options.layer_types = {"GPT2Block"};
  const std::string unknown = testing::usage_error_message([&] { auto_wrap(*model, options); });
  EXPECT_NE(unknown.find("WrapLayerImpl"), std::string::npos) << unknown;
}

}  // namespace
}  // namespace tandem
