// Bad setups are refused with a message that says what and how to fix it.

#include <thread>

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"
#include "zero/comm_queue.h"

namespace tandem {
namespace {

using testing::Recipe;

std::string construct_error(ZeroOptions options, bool sharded_blocks,
                            const std::string& optimizer = "adam") {
  auto pg = ProcessGroup::local();
  Recipe r;
  r.depth = sharded_blocks ? 2 : 0;
  testing::Stack model = testing::make_model(r);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (optimizer == "lbfgs") {
    opt = std::make_unique<torch::optim::LBFGS>(model->parameters());
  } else if (optimizer == "amsgrad") {
    opt = std::make_unique<torch::optim::Adam>(model->parameters(),
                                               torch::optim::AdamOptions().amsgrad(true));
  } else {
    opt = std::make_unique<torch::optim::Adam>(model->parameters());
  }
  try {
    ZeroOptimizer zero(model, *opt, pg, options);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// An error on ZeRO's collective helper thread names the rank of the thread
// that owns the optimizer, as the training thread's own errors do.
TEST(ZeroErrors, ErrorsOnTheCommThreadCarryTheOwningRank) {
  std::thread rank_thread([] {
    set_thread_rank_label(1, 3);
    int group = 0;
    detail::CommQueue queue(&group);
    auto done = queue.submit([] { TANDEM_THROW(CommError, "all-gather failed"); });
    try {
      done.get();
      ADD_FAILURE() << "the task's error was lost";
    } catch (const CommError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("[rank 1/3] all-gather failed", 0), 0u) << e.what();
    }
    clear_thread_rank_label();
  });
  rank_thread.join();
}

// Two ZeRO optimizers over one process group (a GAN's players) queue on one
// helper thread, so their collectives run in the order they were queued on
// every rank; another group gets a thread of its own.
TEST(ZeroErrors, QueuesOfOneGroupShareOneThreadInQueueOrder) {
  int group = 0, other_group = 0;
  detail::CommQueue a(&group);
  detail::CommQueue b(&group);
  detail::CommQueue c(&other_group);
  std::mutex mutex;
  std::vector<std::string> order;
  std::vector<std::thread::id> threads;
  auto task = [&](std::string name) {
    return [&, name] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(name);
      threads.push_back(std::this_thread::get_id());
    };
  };
  for (int i = 0; i < 20; ++i) {
    a.submit(task("a" + std::to_string(i)));
    b.submit(task("b" + std::to_string(i)));
  }
  a.drain();
  std::vector<std::string> expected;
  for (int i = 0; i < 20; ++i) {
    expected.push_back("a" + std::to_string(i));
    expected.push_back("b" + std::to_string(i));
  }
  EXPECT_EQ(order, expected) << "a.drain() waits for b's tasks too, and they ran in queue order";
  for (const auto& id : threads) EXPECT_EQ(id, threads.front());
  c.submit(task("c")).get();
  EXPECT_NE(threads.back(), threads.front()) << "another group runs on its own thread";
}

TEST(ZeroErrors, StageThreeWithoutUnitsIsNoErrorItKeepsParametersWhole) {
  // FSDP's root unit: test_zero_auto_wrap.cpp checks how it trains.
  ZeroOptions options;
  options.stage = 3;
  EXPECT_EQ(construct_error(options, false), "");
}

TEST(ZeroErrors, LbfgsAndAmsgradWithoutAFactoryAreRefused) {
  ZeroOptions options;
  EXPECT_NE(construct_error(options, true, "lbfgs").find("Only stage 0"), std::string::npos);
  EXPECT_NE(construct_error(options, true, "amsgrad").find("amsgrad"), std::string::npos);
}

TEST(ZeroErrors, OffloadParamNeedsStageThreeAndStageMustBeOneToThree) {
  ZeroOptions options;
  options.offload_param = true;
  EXPECT_NE(construct_error(options, true).find("offload_param needs stage 3"), std::string::npos);
  ZeroOptions stage0;
  stage0.stage = 0;
  EXPECT_NE(construct_error(stage0, true).find("stage must be 1, 2 or 3"), std::string::npos);
}

// A source that throws on one rank (its file unreadable) must not leave the
// other ranks alone in the all-gathers that make stages 1 and 2 whole again:
// that rank still joins them and then throws; the others return.
TEST(ZeroErrors, ALoadThatFailsOnOneRankStillJoinsTheAllGathers) {
  for (int stage : {1, 2, 3}) {
    for (int world : {2, 3}) {
      std::mutex mutex;
      std::map<int, std::string> outcome;
      ProcessGroupOptions quick;
      quick.timeout = std::chrono::seconds(20);  // a hang fails as a timeout
      testing::run_ranks(
          world,
          [&](ProcessGroup& pg) {
            Recipe r;
            r.depth = 2;
            testing::Stack model = testing::make_model(r);
            torch::optim::Adam opt(model->parameters());
            ZeroOptions options;
            options.stage = stage;
            ZeroOptimizer zero(model, opt, pg.shared_from_this(), options);
            std::string text = "returned";
            try {
              zero.load_shards(
                  [&](const std::string&, const std::string& name, int64_t, int64_t length) {
                    if (pg.rank() == 1) TANDEM_THROW(CheckpointError, "cannot read '{}'", name);
                    return torch::zeros({length});
                  },
                  7);
            } catch (const CheckpointError& e) {
              text = e.what();
            }
            // Every rank goes on to the next collective together.
            at::Tensor one = torch::ones({1});
            pg.all_reduce(one);
            EXPECT_EQ(one.item<float>(), world);
            EXPECT_EQ(zero.step_count(), pg.rank() == 1 ? 0 : 7);
            std::lock_guard<std::mutex> lock(mutex);
            outcome[pg.rank()] = text;
          },
          quick);
      for (int rank = 0; rank < world; ++rank) {
        if (rank == 1) {
          EXPECT_NE(outcome[rank].find("cannot read"), std::string::npos) << outcome[rank];
        } else {
          EXPECT_EQ(outcome[rank], "returned") << "stage " << stage << " world " << world;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
