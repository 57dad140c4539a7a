// register_for_checkpointing and the save/load pre-hooks: custom objects
// come back from rank 0's saved state on every rank, in registration order,
// a checkpoint with another count is refused before anything changes, and
// the hooks run before the save/load with the models and the directory,
// until removed.

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace state_hooks_test {

using testing::copy_state;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::Mlp;
using testing::reference_init;
using testing::run_ranks;
using testing::ScratchDir;

// A running statistic, as a program would keep one (an EMA of the loss).
struct RunningStat final : Checkpointable {
  int64_t count = 0;
  at::Tensor history = torch::zeros({3});
  CustomState state_dict() const override {
    CustomState s;
    s.values["count"] = count;
    s.tensors.emplace_back("history", history);
    return s;
  }
  void load_state_dict(const CustomState& s) override {
    count = s.values.at("count").get<int64_t>();
    ASSERT_EQ(s.tensors.size(), 1u);
    ASSERT_EQ(s.tensors[0].first, "history");
    history = s.tensors[0].second.clone();
  }
};

class StateHooks : public ::testing::TestWithParam<int> {};

TEST_P(StateHooks, CustomObjectsComeBackFromRankZerosStateInOrder) {
  const int world = GetParam();
  const Mlp init = reference_init();
  ScratchDir dir;
  run_ranks(world, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    accelerator.prepare_model(model);
    auto first = std::make_shared<RunningStat>();
    auto second = std::make_shared<RunningStat>();
    int64_t epoch = 0;  // a plain counter, through the function pair
    accelerator.register_for_checkpointing(first);
    accelerator.register_for_checkpointing(
        [&] {
          CustomState s;
          s.values["epoch"] = epoch;
          return s;
        },
        [&](const CustomState& s) { epoch = s.values.at("epoch").get<int64_t>(); });
    accelerator.register_for_checkpointing(second);
    EXPECT_THROW(accelerator.register_for_checkpointing(first), UsageError);
    // Each rank's values differ: rank 0's are the ones saved.
    first->count = 10 + r;
    first->history = torch::arange(3, torch::kFloat) + r;
    second->count = 20 + r;
    second->history = torch::full({3}, 7.0f + r);
    epoch = 3 + r;
    accelerator.save_state(dir.path());
    first->count = second->count = -1;
    first->history.zero_();
    second->history.zero_();
    epoch = -1;
    accelerator.load_state(dir.path());
    EXPECT_EQ(first->count, 10) << "rank " << r;
    EXPECT_EQ(second->count, 20) << "rank " << r;
    EXPECT_EQ(epoch, 3) << "rank " << r;
    EXPECT_TRUE(torch::equal(first->history, torch::arange(3, torch::kFloat)));
    EXPECT_TRUE(torch::equal(second->history, torch::full({3}, 7.0f)));
  });

  // Another run registering a different number of objects: refused before
  // the model changes.
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut);
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.fill_(0.5);
    accelerator.prepare_model(model);
    accelerator.register_for_checkpointing(std::make_shared<RunningStat>());
    try {
      accelerator.load_state(dir.path());
      ADD_FAILURE() << "a checkpoint with 3 custom objects loaded into a run with 1";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("3 custom object(s)"), std::string::npos) << e.what();
    }
    for (auto& p : model->parameters()) EXPECT_TRUE((p == 0.5).all().item<bool>());
  });
}

TEST_P(StateHooks, PreHooksRunFirstWithTheModelsAndDirectoryUntilRemoved) {
  const int world = GetParam();
  ScratchDir dir;
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Mlp model(kIn, kHidden, kOut), head(kHidden, kOut, kOut);
    accelerator.prepare_model(model);
    accelerator.prepare_model(head);
    std::vector<std::string> calls;
    auto save_handle = accelerator.register_save_state_pre_hook(
        [&](const std::vector<std::shared_ptr<torch::nn::Module>>& models, const std::string& d) {
          ASSERT_EQ(models.size(), 2u);
          EXPECT_EQ(models[0], model.ptr());
          EXPECT_EQ(models[1], head.ptr());
          EXPECT_EQ(d, dir.path());
          // Before anything is written: the first save finds no checkpoint.
          calls.push_back(Accelerator::has_checkpoint(d) ? "save again" : "save first");
        });
    auto second_save = accelerator.register_save_state_pre_hook(
        [&](const auto&, const std::string&) { calls.push_back("save second hook"); });
    auto load_handle = accelerator.register_load_state_pre_hook(
        [&](const std::vector<std::shared_ptr<torch::nn::Module>>& models, const std::string& d) {
          EXPECT_EQ(models.size(), 2u);
          EXPECT_EQ(d, dir.path());
          calls.push_back("load");
        });
    SaveStateOptions options;
    options.tag = "a";
    accelerator.save_state(dir.path(), options);
    accelerator.load_state(dir.path());
    save_handle.remove();
    save_handle.remove();  // twice: nothing
    load_handle.remove();
    options.tag = "b";
    accelerator.save_state(dir.path(), options);
    accelerator.load_state(dir.path());
    EXPECT_EQ(calls, (std::vector<std::string>{"save first", "save second hook", "load",
                                               "save second hook"}))
        << "rank " << pg.rank();
  });
}

// An object whose load fails on one rank alone (its own file, its own
// check): that rank throws its error and every other rank stops in
// load_state too, naming it, instead of waiting for it in a collective or
// training on with a partly loaded state.
TEST_P(StateHooks, AnObjectThatFailsToLoadOnOneRankStopsEveryRank) {
  const int world = GetParam();
  const Mlp init = reference_init();
  ScratchDir dir;
  std::mutex mutex;
  std::map<int, std::string> outcome;
  ProcessGroupOptions quick;
  quick.timeout = std::chrono::seconds(20);  // a hang fails as a timeout
  run_ranks(
      world,
      [&](ProcessGroup& pg) {
        Accelerator accelerator(pg.shared_from_this(), Config{});
        Mlp model(kIn, kHidden, kOut);
        copy_state(*model, *init);
        accelerator.prepare_model(model);
        accelerator.register_for_checkpointing(
            [] { return CustomState{}; },
            [&](const CustomState&) {
              if (pg.rank() == 1) throw std::runtime_error("rank 1's cache is gone");
            });
        accelerator.save_state(dir.path());
        std::string text = "loaded";
        try {
          accelerator.load_state(dir.path());
        } catch (const CheckpointError& e) {
          text = std::string("CheckpointError: ") + e.what();
        } catch (const std::runtime_error& e) {
          text = std::string("runtime_error: ") + e.what();
        }
        std::lock_guard<std::mutex> lock(mutex);
        outcome[pg.rank()] = text;
      },
      quick);
  EXPECT_EQ(outcome[1], "runtime_error: rank 1's cache is gone");
  for (int r = 0; r < world; ++r) {
    if (r == 1) continue;
    EXPECT_NE(outcome[r].find("CheckpointError: "), std::string::npos) << outcome[r];
    EXPECT_NE(outcome[r].find("another rank failed to load its part of the checkpoint"),
              std::string::npos)
        << outcome[r];
    EXPECT_NE(outcome[r].find("rank 1: rank 1's cache is gone"), std::string::npos)
        << outcome[r];
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndThree, StateHooks, ::testing::Values(2, 3));

}  // namespace state_hooks_test
}  // namespace tandem
