// DeepSpeed's wall_clock_breakdown and steps_per_print in the Accelerator:
// the trackers get the four averages at every steps_per_print-th optimizer
// step, each part of a step lands where docs/accelerator.md says (simulated
// work before backward in forward_ms, in backward's graph in backward_ms, in
// the optimizer's update in step_ms, a late rank in the others'
// communication_ms), and steps_per_print alone logs DeepSpeed's progress
// line on the main process. Timing checks are lower bounds only (sleeps are
// simulated work here, never synchronisation).

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "support/log_capture.h"
#include "support/accelerator_testing.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace wall_clock_test {

using testing::copy_state;
using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::Mlp;
using testing::run_ranks;

const std::vector<std::string> kKeys = {"wall_clock/backward_ms", "wall_clock/communication_ms",
                                        "wall_clock/forward_ms", "wall_clock/step_ms"};

// SGD whose update also does `delay` of simulated work.
class SlowSgd : public torch::optim::SGD {
 public:
  SlowSgd(std::vector<at::Tensor> params, std::chrono::milliseconds delay)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(0.1)), delay_(delay) {}
  at::Tensor step(LossClosure closure = nullptr) override {
    std::this_thread::sleep_for(delay_);
    return torch::optim::SGD::step(std::move(closure));
  }

 private:
  std::chrono::milliseconds delay_;
};

struct Training {
  int world = 2;
  int zero_stage = 0;
  int64_t accumulation = 1;
  std::optional<bool> breakdown = true;  // AcceleratorOptions; the config's is `config_breakdown`
  bool config_breakdown = false;
  std::optional<int64_t> steps_per_print = 2;
  // Simulated work per micro-step (ms): before the forward pass (on
  // `forward_rank` only, -1: every rank), inside backward, in the update.
  int forward_ms = 0;
  int forward_rank = -1;
  int backward_ms = 0;
  int update_ms = 0;
};

struct Outcome {
  std::vector<nlohmann::json> rows;           // rank 0's metrics lines
  std::vector<WallClockBreakdown> wall_clock;  // per rank
};

// Six optimizer steps of the MLP, batch 4 per rank, logging nothing itself.
Outcome train(const Training& run) {
  const Mlp init = testing::reference_init();
  const int64_t steps = 6;
  const auto data = testing::make_dataset(run.world * 4 * steps * run.accumulation);
  const testing::ScratchDir dir;
  Outcome out;
  out.wall_clock.resize(run.world);
  std::mutex mutex;
  run_ranks(run.world, [&](ProcessGroup& pg) {
    Config config;
    config.zero.stage = run.zero_stage;
    config.gradient_accumulation_steps = run.accumulation;
    config.wall_clock_breakdown = run.config_breakdown;
    AcceleratorOptions options;
    options.wall_clock_breakdown = run.breakdown;
    options.steps_per_print = run.steps_per_print;
    Accelerator accelerator(pg.shared_from_this(), config, options);
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<SlowSgd>(model->parameters(),
                                         std::chrono::milliseconds(run.update_ms));
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, 4);
    accelerator.init_trackers(dir / "metrics.jsonl");
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      if (run.forward_rank < 0 || run.forward_rank == pg.rank()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(run.forward_ms));
      }
      auto loss = torch::mse_loss(model->forward(batch[0]), batch[1]);
      if (run.backward_ms > 0) {
        loss.register_hook([&run](at::Tensor grad) {
          std::this_thread::sleep_for(std::chrono::milliseconds(run.backward_ms));
          return grad;
        });
      }
      accelerator.backward(loss);
      optimizer->step();
    }
    EXPECT_EQ(accelerator.step(), steps);
    accelerator.end_training();
    std::lock_guard<std::mutex> lock(mutex);
    out.wall_clock[pg.rank()] = accelerator.wall_clock();
  });
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.rows.push_back(nlohmann::json::parse(line));
  return out;
}

double value(const WallClockBreakdown& w, const std::string& key) {
  if (key == "wall_clock/forward_ms") return w.forward_ms;
  if (key == "wall_clock/backward_ms") return w.backward_ms;
  if (key == "wall_clock/step_ms") return w.step_ms;
  return w.communication_ms;
}

// (world, ZeRO stage): DDP is stage 0.
class WallClock : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(WallClock, TrackersGetTheFourAveragesAtEveryStepsPerPrintSteps) {
  const auto [world, stage] = GetParam();
  Training run;
  run.world = world;
  run.zero_stage = stage;
  const Outcome out = train(run);
  ASSERT_EQ(out.rows.size(), 3u);
  for (std::size_t i = 0; i < out.rows.size(); ++i) {
    const nlohmann::json& row = out.rows[i];
    EXPECT_EQ(row["step"], 2 * static_cast<int64_t>(i + 1));
    std::set<std::string> keys;
    for (const auto& item : row.items()) keys.insert(item.key());
    std::set<std::string> expected(kKeys.begin(), kKeys.end());
    expected.insert({"step", "time"});
    EXPECT_EQ(keys, expected);
    for (const auto& key : kKeys) {
      ASSERT_TRUE(row[key].is_number()) << key << " at step " << row["step"];
      const double ms = row[key].get<double>();
      EXPECT_TRUE(std::isfinite(ms) && ms >= 0) << key << " = " << ms;
    }
    EXPECT_GT(row["wall_clock/backward_ms"].get<double>(), 0);
    if (world > 1) {
      EXPECT_GT(row["wall_clock/communication_ms"].get<double>(), 0);
    }
  }
  // One process without ZeRO communicates nothing.
  if (world == 1 && stage == 0) {
    EXPECT_EQ(out.rows[2]["wall_clock/communication_ms"], 0.0);
  }
  // The API gives the last window: rank 0's is what the trackers got.
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(out.wall_clock[r].step, 6) << "rank " << r;
    EXPECT_EQ(out.wall_clock[r].steps, 2) << "rank " << r;
    EXPECT_GT(out.wall_clock[r].backward_ms, 0) << "rank " << r;
  }
  for (const auto& key : kKeys) {
    EXPECT_DOUBLE_EQ(value(out.wall_clock[0], key), out.rows[2][key].get<double>()) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStrategies, WallClock,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 2)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == 0 ? "_ddp" : "_zero2");
                         });

TEST(WallClockParts, SimulatedWorkLandsInThePartThatRanItSummedOverMicroSteps) {
  for (int stage : {0, 2}) {
    Training run;
    run.zero_stage = stage;
    run.accumulation = 2;
    run.forward_ms = 30;
    run.backward_ms = 20;
    // Under ZeRO the shards are updated by tandem, not by the optimizer's step().
    run.update_ms = stage == 0 ? 25 : 0;
    const Outcome out = train(run);
    ASSERT_EQ(out.rows.size(), 3u) << "stage " << stage;
    for (int r = 0; r < run.world; ++r) {
      const WallClockBreakdown& w = out.wall_clock[r];
      // Two micro-steps per optimizer step, each with its own work.
      EXPECT_GE(w.forward_ms, 60) << "stage " << stage << ", rank " << r;
      EXPECT_GE(w.backward_ms, 40) << "stage " << stage << ", rank " << r;
      EXPECT_GE(w.step_ms, run.update_ms) << "stage " << stage << ", rank " << r;
    }
  }
}

TEST(WallClockParts, RanksWaitingForALateRankCountItAsCommunication) {
  for (int world : {2, 3}) {
    for (int stage : {0, 2}) {
      Training run;
      run.world = world;
      run.zero_stage = stage;
      run.forward_ms = 50;  // rank 1 arrives 50 ms late to every backward
      run.forward_rank = 1;
      const Outcome out = train(run);
      ASSERT_EQ(out.rows.size(), 3u);
      // Rank 0 waits for rank 1's gradients: a generous lower bound, since
      // rank 0 may itself be descheduled for part of the wait.
      EXPECT_GE(out.wall_clock[0].communication_ms, 10)
          << world << " ranks, stage " << stage;
      EXPECT_GE(out.wall_clock[1].forward_ms, 50) << world << " ranks, stage " << stage;
    }
  }
}

TEST(WallClockOptions, TheCodeOptionBeatsTheConfigAndOffReportsNothing) {
  Training off;
  off.config_breakdown = true;
  off.breakdown = false;  // the option turns the config's breakdown off
  off.steps_per_print = std::nullopt;
  Outcome out = train(off);
  EXPECT_TRUE(out.rows.empty());
  EXPECT_EQ(out.wall_clock[0].step, 0);
  EXPECT_EQ(out.wall_clock[0].forward_ms, 0);

  Training from_config;
  from_config.config_breakdown = true;
  from_config.breakdown = std::nullopt;
  from_config.steps_per_print = std::nullopt;  // the default window: 10 steps, none in 6
  out = train(from_config);
  EXPECT_TRUE(out.rows.empty());
  from_config.steps_per_print = 3;
  out = train(from_config);
  ASSERT_EQ(out.rows.size(), 2u);
  EXPECT_EQ(out.rows[1]["step"], 6);
  EXPECT_EQ(out.wall_clock[1].steps, 3);
}

TEST(WallClockCounters, DdpReadsNoClockUntilTimingIsOnAndZeroKeepsItsTotalThroughAReset) {
  const Mlp init = testing::reference_init();
  const auto data = testing::make_dataset(16);
  run_ranks(2, [&](ProcessGroup& pg) {
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    DistributedDataParallel ddp(model, pg.shared_from_this());
    auto backward = [&] { torch::mse_loss(model->forward(data.x), data.y).backward(); };
    backward();
    EXPECT_EQ(ddp.communication_wait_seconds(), 0.0);
    ddp.set_wait_timing(true);
    backward();
    EXPECT_GT(ddp.communication_wait_seconds(), 0.0);
  });
  run_ranks(2, [&](ProcessGroup& pg) {
    Config config;
    config.zero.stage = 2;
    Accelerator accelerator(pg.shared_from_this(), config);
    Mlp model(kIn, kHidden, kOut);
    copy_state(*model, *init);
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), 0.1);
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, 4);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
    }
    auto zero = accelerator.zero_optimizer();
    const ZeroOptimizer::CommStats stats = zero->comm_stats();
    EXPECT_GT(stats.update_gather_seconds, 0);  // stage 2 gathers the updated partitions
    const double total = zero->communication_wait_seconds();
    EXPECT_NEAR(total,
                stats.gather_wait_seconds + stats.drain_wait_seconds + stats.update_gather_seconds,
                1e-9);
    zero->reset_stats();
    EXPECT_EQ(zero->communication_wait_seconds(), total);
  });
}

std::vector<std::string> lines_with(const std::string& text, const std::string& part) {
  std::vector<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(part) != std::string::npos) out.push_back(line);
  }
  return out;
}

TEST(WallClockLog, StepsPerPrintAloneLogsTheProgressLineOnTheMainProcess) {
  Training run;
  run.breakdown = std::nullopt;
  const std::string log = testing::info_log_of([&] {
    const Outcome out = train(run);
    EXPECT_TRUE(out.rows.empty()) << "the progress line goes to the log only";
    EXPECT_EQ(out.wall_clock[0].step, 0);
  });
  const std::vector<std::string> progress = lines_with(log, "tandem info: step=");
  ASSERT_EQ(progress.size(), 3u) << log;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(progress[i], "[rank 0/2] tandem info: step=" + std::to_string(2 * (i + 1)) +
                               ", skipped=0, lr=[0.1], loss_scale=1");
  }
  EXPECT_TRUE(lines_with(log, "time (ms)").empty()) << log;
}

TEST(WallClockLog, TheBreakdownLogsATimeLinePerWindowBesideTheProgressLine) {
  Training run;
  run.world = 3;
  run.steps_per_print = 3;
  const std::string log = testing::info_log_of([&] { train(run); });
  const std::vector<std::string> times = lines_with(log, "time (ms) | fwd: ");
  ASSERT_EQ(times.size(), 2u) << log;  // steps 3 and 6, rank 0 only
  for (const auto& line : times) {
    EXPECT_EQ(line.rfind("[rank 0/3] tandem info: time (ms) | fwd: ", 0), 0u) << line;
    EXPECT_NE(line.find(" | bwd: "), std::string::npos) << line;
    EXPECT_NE(line.find(" | step: "), std::string::npos) << line;
    EXPECT_NE(line.find(" | comm: "), std::string::npos) << line;
  }
  EXPECT_EQ(lines_with(log, "tandem info: step=").size(), 2u) << log;
}

}  // namespace wall_clock_test
}  // namespace tandem
