// tandem::zero::Init: each Sharded unit cut to this rank's shard as it is
// built. Specification: the values are the materialised model's (same seed),
// no rank keeps a whole unit, training is the same as without Init, and every
// misuse is refused with the reason.

#include <gtest/gtest.h>

#include <optional>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"
#include "tandem/parallel/ddp.h"

namespace tandem::testing {
namespace {

// Odd sizes: no unit divides evenly by 2 or 3 ranks.
Recipe odd_recipe() {
  Recipe r;
  r.in = 5;
  r.width = 13;
  r.out = 3;
  r.depth = 3;
  r.global_batch = 6;
  return r;
}

// Whole parameters of a stage-3 model, gathered.
Params gathered(ZeroOptimizer& zero, const torch::nn::Module& model) {
  ZeroOptimizer::GatheredParameters whole(zero);
  return snapshot(model);
}

void expect_same(const Params& got, const Params& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, value] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(torch::equal(got.at(name), value)) << name;
  }
}

class ZeroInitWorlds : public ::testing::TestWithParam<int> {};

TEST_P(ZeroInitWorlds, InitialValuesAreTheMaterialisedModels) {
  const Recipe r = odd_recipe();
  const Params reference = snapshot(*make_model(r));
  run_ranks(GetParam(), [&](ProcessGroup& pg) {
    Stack model = make_model(r, &pg);
    // Each unit holds only its shard now: no parameter inside one has memory.
    for (const auto& block : model->blocks) {
      for (const auto& p : block->parameters()) EXPECT_FALSE(holds_memory(p));
    }
    EXPECT_TRUE(holds_memory(model->input->weight));  // outside every unit: whole
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    expect_same(gathered(zero, *model), reference);
  });
}

TEST_P(ZeroInitWorlds, TrainsExactlyAsWithoutInit) {
  Recipe r = odd_recipe();
  r.steps = 3;
  run_ranks(GetParam(), [&](ProcessGroup& pg) {
    const Params materialised = train_zero(pg, r, stage3());
    Recipe cut = r;
    cut.zero_init = true;
    expect_same(train_zero(pg, cut, stage3()), materialised);
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, ZeroInitWorlds, ::testing::Values(1, 2, 3));

TEST(ZeroInit, KeepsOneRanksShardOfEachUnit) {
  const Recipe r = odd_recipe();
  run_ranks(3, [&](ProcessGroup& pg) {
    Stack model = make_model(r, &pg);
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    // Stage-3 accounting between steps: the unit shards plus the whole
    // loose layers, as without Init.
    int64_t unit_elements = 0;
    for (const auto& block : model->blocks) {
      for (const auto& p : block->parameters()) unit_elements += p.numel();
    }
    const int64_t loose_elements = model->input->weight.numel() + model->input->bias.numel() +
                                   model->output->weight.numel() + model->output->bias.numel();
    const int64_t per_unit = unit_elements / r.depth;
    const int64_t shards = r.depth * ((per_unit + 2) / 3);
    EXPECT_EQ(zero.memory_stats().parameter_bytes, (shards + loose_elements) * 4);
  });
}

// A unit inside a unit, and a weight tied across two units after the cut:
// both come out as the materialised model's.
struct NestedImpl : torch::nn::Module {
  explicit NestedImpl(int width) {
    inner = register_module("inner", Sharded<BlockImpl>(width));
    fc = register_module("fc", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(torch::Tensor x) { return fc(inner->forward(x)); }
  Sharded<BlockImpl> inner{nullptr};
  torch::nn::Linear fc{nullptr};
};

struct TiedImpl : torch::nn::Module {
  explicit TiedImpl(int width) {
    a = register_module("a", Sharded<NestedImpl>(width));
    b = register_module("b", Sharded<BlockImpl>(width));
    head = register_module("head", torch::nn::Linear(width, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return head(b->forward(a->forward(x))); }
  Sharded<NestedImpl> a{nullptr};
  Sharded<BlockImpl> b{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Tied);

Tied make_tied(const ProcessGroup* zero_init, bool freeze) {
  std::lock_guard<std::mutex> lock(init_mutex());
  torch::manual_seed(7);
  std::optional<zero::Init> init;
  if (zero_init != nullptr) init.emplace(*zero_init);
  Tied model(11);
  init.reset();
  // After the cut: a's fc weight tied into b (so neither unit owns it) and,
  // optionally, b's norm weight frozen.
  model->b->register_parameter("tied", model->a->fc->weight);
  if (freeze) model->b->norm->weight.set_requires_grad(false);
  return model;
}

TEST(ZeroInit, NestedUnitsAndParametersChangedAfterTheCut) {
  const Params reference = snapshot(*make_tied(nullptr, /*freeze=*/true));
  run_ranks(3, [&](ProcessGroup& pg) {
    Tied model = make_tied(&pg, /*freeze=*/true);
    std::vector<torch::Tensor> trainable;
    for (const auto& p : unique_parameters(*model)) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    auto adam = make_optimizer(Opt::kAdam, trainable);
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    expect_same(gathered(zero, *model), reference);
    // And it trains: one step on a batch.
    auto x = torch::ones({4, 11});
    zero.zero_grad();
    model->forward(x).sum().backward();
    zero.step();
  });
}

TEST(ZeroInit, RanksThatBuiltDifferentValuesAreRefused) {
  const Recipe r = odd_recipe();
  run_ranks(2, [&](ProcessGroup& pg) {
    std::optional<Stack> model;
    {
      std::lock_guard<std::mutex> lock(init_mutex());
      torch::manual_seed(100 + pg.rank());  // a seed per rank: a bug under Init
      zero::Init init(pg);
      model.emplace(r.in, r.width, r.out, r.depth, r.loose);
    }
    auto adam = make_optimizer(Opt::kAdam, (*model)->parameters());
    try {
      ZeroOptimizer zero(*model, *adam, pg.shared_from_this(), stage3());
      ADD_FAILURE() << "built a ZeroOptimizer over units the ranks built differently";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("manual_seed"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("block0"), std::string::npos) << e.what();
    }
  });
}

TEST(ZeroInit, InitOnSomeRanksOnlyIsRefused) {
  const Recipe r = odd_recipe();
  run_ranks(2, [&](ProcessGroup& pg) {
    Stack model = make_model(r, pg.rank() == 0 ? &pg : nullptr);
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    EXPECT_THROW(
        {
          try {
            ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
          } catch (const UsageError& e) {
            EXPECT_NE(std::string(e.what()).find("some ranks"), std::string::npos) << e.what();
            throw;
          }
        },
        UsageError);
  });
}

TEST(ZeroInit, InitForAnotherWorldSizeIsRefused) {
  const Recipe r = odd_recipe();
  run_ranks(2, [&](ProcessGroup& pg) {
    std::optional<Stack> model;
    {
      std::lock_guard<std::mutex> lock(init_mutex());
      torch::manual_seed(42);
      zero::Init init(3, pg.rank());
      model.emplace(r.in, r.width, r.out, r.depth, r.loose);
    }
    auto adam = make_optimizer(Opt::kAdam, (*model)->parameters());
    EXPECT_THROW(ZeroOptimizer(*model, *adam, pg.shared_from_this(), stage3()), UsageError);
  });
}

TEST(ZeroInit, CutModelRefusesToRunOrToBeTrainedWithoutStage3) {
  const Recipe r = odd_recipe();
  const Params reference = snapshot(*make_model(r));
  run_ranks(2, [&](ProcessGroup& pg) {
    Stack model = make_model(r, &pg);
    try {
      model->forward(torch::ones({2, r.in}));
      ADD_FAILURE() << "a cut unit ran its forward";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("zero::Init"), std::string::npos) << e.what();
    }
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    ZeroOptions stage2;
    stage2.stage = 2;
    EXPECT_THROW(ZeroOptimizer(model, *adam, pg.shared_from_this(), stage2), UsageError);
    DDPOptions ddp_options;
    ddp_options.cache_cpu_allocations = false;
    EXPECT_THROW(DistributedDataParallel(model, pg.shared_from_this(), ddp_options), UsageError);
    // The refusals left the shards in place: stage 3 still adopts them.
    ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
    expect_same(gathered(zero, *model), reference);
  });
}

TEST(ZeroInit, AnInitialisationOverTheWholeModelAfterTheCutIsRefusedNotLost) {
  const Recipe r = odd_recipe();
  run_ranks(2, [&](ProcessGroup& pg) {
    Stack model = make_model(r, &pg);
    {
      // GPT-2's loop over every parameter once the model is built: the cut
      // units' parameters hold no memory, so this must neither crash nor be
      // silently dropped.
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.normal_(0.0, 0.02);
    }
    auto adam = make_optimizer(Opt::kAdam, model->parameters());
    try {
      ZeroOptimizer zero(model, *adam, pg.shared_from_this(), stage3());
      ADD_FAILURE() << "adopted units whose parameters were written after the cut";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("written after"), std::string::npos) << e.what();
    }
  });
}

TEST(ZeroInit, BadRankIsRefused) {
  EXPECT_THROW(zero::Init(2, 2), UsageError);
  EXPECT_THROW(zero::Init(0, 0), UsageError);
  EXPECT_FALSE(zero::Init::disabled().enabled());
}

}  // namespace
}  // namespace tandem::testing
