// What must hold under every way the Accelerator holds a model (DDP, ZeRO
// stages 1, 2 and 3 with every parameter partitioned), at 2 and 3 ranks:
// get_state_dict() gives the whole tensors, loading weights only leaves the
// optimizer fresh, and frozen parameters listed in the optimizer are skipped.
// Each was once true under DDP and false under ZeRO.

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include <torch/torch.h>

#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace accelerator_strategies {

using testing::Params;
using testing::run_ranks;

constexpr int kStages[] = {0, 1, 2, 3};
constexpr int kWorlds[] = {2, 3};

Config config_for(int stage) {
  Config config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;  // partition every parameter
  config.zero.reduce_bucket_size = 150;
  return config;
}

// 24 rows: 4 per rank per batch at world 3, 6 at world 2 ... one global
// batch of 12 each step.
struct Data {
  torch::Tensor x, y;
};
Data data() {
  auto gen = at::detail::createCPUGenerator(17);
  testing::Recipe r;
  return {torch::randn({48, r.in}, gen), torch::randint(0, r.out, {48}, gen)};
}

// One rank's Accelerator, model and AdamW over model->parameters(); `freeze`
// turns requires_grad off on the input layer after construction.
struct Rank {
  Rank(ProcessGroup& pg, int stage, bool freeze = false)
      : accelerator(pg.shared_from_this(), config_for(stage)) {
    model = testing::make_model(recipe);
    if (freeze) {
      for (auto& p : model->input->parameters()) p.requires_grad_(false);
    }
    auto adamw = std::make_shared<torch::optim::AdamW>(model->parameters(),
                                                       torch::optim::AdamWOptions(1e-2));
    accelerator.prepare_model(model);
    optimizer = accelerator.prepare_optimizer(adamw);
  }
  // `steps` optimizer steps over rank-sliced rows of `d` (12 rows a step).
  void train(const Data& d, int steps, int world) {
    const int per = 12 / world;
    for (int s = 0; s < steps; ++s) {
      auto x = d.x.narrow(0, s * 12 + accelerator.process_index() * per, per);
      auto y = d.y.narrow(0, s * 12 + accelerator.process_index() * per, per);
      optimizer->zero_grad();
      accelerator.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
      optimizer->step();
    }
  }
  Params state_dict() {
    Params out;
    for (auto& [name, t] : accelerator.get_state_dict()) out[name] = t;
    return out;
  }
  testing::Recipe recipe;
  Accelerator accelerator;
  testing::Stack model{nullptr};
  std::shared_ptr<AcceleratedOptimizer> optimizer;
};

// Every rank's get_state_dict() after `steps` steps.
std::vector<Params> state_dicts(int world, int stage, int steps, bool inside_guard = false) {
  const Data d = data();
  std::vector<Params> out(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    Rank rank(pg, stage);
    rank.train(d, steps, world);
    std::optional<ZeroOptimizer::GatheredParameters> guard;
    if (inside_guard && stage == 3) guard.emplace(*rank.accelerator.zero_optimizer());
    out[pg.rank()] = rank.state_dict();
  });
  return out;
}

void expect_whole_and_equal(const std::vector<Params>& got, const Params& want, double tolerance,
                            const std::string& what) {
  for (std::size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want.size()) << what << " rank " << r;
    for (const auto& [name, t] : want) {
      ASSERT_EQ(got[r].at(name).sizes(), t.sizes()) << what << " rank " << r << " " << name;
    }
    EXPECT_LE(testing::max_relative_diff(got[r], want), tolerance) << what << " rank " << r;
  }
}

TEST(AcceleratorStrategies, GetStateDictGivesWholeTensorsUnderEveryStrategy) {
  for (int world : kWorlds) {
    const Params initial = state_dicts(world, 0, 0)[0];
    const Params trained = state_dicts(world, 0, 2)[0];
    for (int stage : kStages) {
      const std::string what = "world " + std::to_string(world) + " stage " + std::to_string(stage);
      // Right after prepare (ZeRO-3 has already partitioned everything) and
      // after training; under ZeRO-3 also inside a GatheredParameters guard.
      expect_whole_and_equal(state_dicts(world, stage, 0), initial, 0.0, what + " untrained");
      expect_whole_and_equal(state_dicts(world, stage, 2), trained, 1e-5, what + " trained");
      if (stage == 3) {
        expect_whole_and_equal(state_dicts(world, stage, 2, true), trained, 1e-5,
                               what + " inside GatheredParameters");
      }
    }
  }
}

// Loads `dir` weights-only into a fresh run, checks the optimizer is fresh,
// then takes one step; returns rank 0's parameters after it.
Params load_weights_then_step(int world, int stage, const std::string& dir, const Params& saved) {
  const Data d = data();
  Params out;
  run_ranks(world, [&](ProcessGroup& pg) {
    Rank rank(pg, stage);
    LoadStateOptions options;
    options.load_optimizer_states = false;
    rank.accelerator.load_state(dir, options);
    EXPECT_EQ(testing::max_relative_diff(rank.state_dict(), saved), 0.0)
        << "stage " << stage << ": the weights were not loaded";
    if (const auto zero = rank.accelerator.zero_optimizer()) {
      EXPECT_EQ(zero->step_count(), 0) << "stage " << stage;
      for (const auto& fragment : zero->shard_fragments()) {
        for (const auto& state : fragment.state) {
          EXPECT_EQ(state.abs().max().item<double>(), 0.0)
              << "stage " << stage << ": optimizer state of '" << fragment.name << "' loaded";
        }
      }
    } else {
      EXPECT_TRUE(rank.optimizer->state().empty()) << "DDP: optimizer state loaded";
    }
    rank.train(d, 1, world);
    const Params state = rank.state_dict();  // collective under ZeRO-3
    if (pg.rank() == 0) out = state;
  });
  return out;
}

TEST(AcceleratorStrategies, LoadingWeightsOnlyLeavesAFreshOptimizerUnderEveryStrategy) {
  for (int world : kWorlds) {
    for (int stage : kStages) {
      testing::ScratchDir dir;
      const Data d = data();
      Params saved;
      run_ranks(world, [&](ProcessGroup& pg) {
        Rank rank(pg, stage);
        rank.train(d, 3, world);  // moments and a step count worth losing
        rank.accelerator.save_state(dir.path());
        const Params state = rank.state_dict();  // collective under ZeRO-3
        if (pg.rank() == 0) saved = state;
      });
      const Params got = load_weights_then_step(world, stage, dir.path(), saved);
      // The same one step from the same weights with a fresh optimizer, under DDP.
      const Params want = load_weights_then_step(world, 0, dir.path(), saved);
      EXPECT_LE(testing::max_relative_diff(got, want), 1e-5)
          << "world " << world << " stage " << stage;
    }
  }
}

TEST(AcceleratorStrategies, FrozenParametersInTheOptimizerAreSkippedUnderEveryStrategy) {
  for (int world : kWorlds) {
    const Data d = data();
    std::vector<Params> after(4);
    Params initial;
    for (int stage : kStages) {
      run_ranks(world, [&](ProcessGroup& pg) {
        Rank rank(pg, stage, /*freeze=*/true);
        const Params before = rank.state_dict();
        if (pg.rank() == 0 && stage == 0) initial = before;
        rank.train(d, 3, world);
        const Params state = rank.state_dict();
        if (pg.rank() == 0) after[stage] = state;
      });
      for (const char* frozen : {"input.weight", "input.bias"}) {
        EXPECT_TRUE(torch::equal(after[stage].at(frozen), initial.at(frozen)))
            << "world " << world << " stage " << stage << ": frozen " << frozen << " moved";
      }
      EXPECT_LE(testing::max_relative_diff(after[stage], after[0]), 1e-5)
          << "world " << world << " stage " << stage << " against DDP";
    }
    EXPECT_GT(testing::max_relative_diff(after[0], initial), 1e-3) << "nothing trained";
  }
}

}  // namespace accelerator_strategies
}  // namespace tandem
