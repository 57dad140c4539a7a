// What a port from HF Accelerate relies on. A prepared scheduler steps as
// Accelerate's AcceleratedScheduler: after
// real optimizer steps only, num_processes times each (once with
// split_batches), and on every call with step_scheduler_with_optimizer off.
// The learning rates are checked against ones recorded from Accelerate
// itself at 2 processes (tests/data/vectors/record_accelerate_scheduler_vectors.py);
// world 3 and the switch against their definitions. Prepared loaders with
// split_batches / dispatch_batches deal batches as Accelerate's (the index
// vectors themselves: tests/data/test_accelerate_sharding.cpp).

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/optim/lr_scheduler.h"

namespace tandem {
namespace {

using testing::run_ranks;

// The recorded loop: Linear(2, 1), SGD(lr 1), WarmupLR (0 to 1 over 16 linear
// steps), accumulation 2, `steps` micro-steps; the learning rate after each,
// from rank 0.
std::vector<double> learning_rates(int world, AcceleratorOptions options, int steps) {
  std::vector<double> lrs;
  options.gradient_accumulation_steps = 2;
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    auto model = torch::nn::Linear(2, 1);
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                   torch::optim::SGDOptions(1.0));
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(sgd);
    WarmupLROptions warmup;
    warmup.warmup_max_lr = 1.0;
    warmup.warmup_num_steps = 16;
    warmup.warmup_type = WarmupType::kLinear;
    auto scheduler = accelerator.prepare_scheduler(std::make_shared<WarmupLR>(*optimizer, warmup));
    for (int i = 0; i < steps; ++i) {
      {
        auto micro_step = accelerator.accumulate(model);
        accelerator.backward(model(torch::ones({4, 2})).sum());
        optimizer->step();
        scheduler->step();
        optimizer->zero_grad();
      }
      if (pg.rank() == 0) lrs.push_back(optimizer->param_groups()[0].options().get_lr());
    }
  });
  return lrs;
}

TEST(SchedulerStepping, StepsAsAcceleratesPreparedSchedulerAtTwoProcesses) {
  std::ifstream in(std::string(TANDEM_TEST_DATA_DIR) + "/accelerate_scheduler.json");
  ASSERT_TRUE(in) << "missing accelerate_scheduler.json";
  const auto recorded = nlohmann::json::parse(in);
  const int steps = recorded["steps"].get<int>();
  EXPECT_EQ(learning_rates(2, {}, steps), recorded["default"].get<std::vector<double>>());
  AcceleratorOptions split;
  split.split_batches = true;
  EXPECT_EQ(learning_rates(2, split, steps), recorded["split_batches"].get<std::vector<double>>());
}

// WarmupLR's rate after k steps (k <= 16): k-1 sixteenths... as DeepSpeed's
// linear warmup: min + (max - min) * iteration / warmup, iteration = k - 1.
double warmed(int64_t steps) { return steps == 0 ? 0.0 : static_cast<double>(steps - 1) / 16; }

TEST(SchedulerStepping, StepsOncePerProcessAtThreeAndOnEveryCallWhenDetached) {
  // 3 processes: each optimizer step (every 2nd micro-step) is 3 warmup steps.
  EXPECT_EQ(learning_rates(3, {}, 6),
            (std::vector<double>{warmed(0), warmed(3), warmed(3), warmed(6), warmed(6),
                                 warmed(9)}));
  // Off: one warmup step per call, accumulating or not.
  AcceleratorOptions detached;
  detached.step_scheduler_with_optimizer = false;
  EXPECT_EQ(learning_rates(2, detached, 6),
            (std::vector<double>{warmed(1), warmed(2), warmed(3), warmed(4), warmed(5),
                                 warmed(6)}));
}

// The usual HF DeepSpeed config's scheduler block is all "auto": it takes
// the values Accelerate fills for DummyScheduler(optimizer, total_num_steps,
// warmup_num_steps), and steps once per optimizer step whatever the world.
std::vector<double> config_schedule(int world, int64_t total, int64_t warmup) {
  Config config;
  config.scheduler.type = "WarmupDecayLR";
  config.scheduler.auto_params = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                  "total_num_steps"};
  config.scheduler.warmup_type = "linear";
  std::vector<double> lrs;
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    auto model = torch::nn::Linear(2, 1);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.4)));
    auto scheduler = accelerator.prepare_scheduler_from_config(optimizer, total, warmup);
    for (int i = 0; i < 12; ++i) {
      accelerator.backward(model(torch::ones({4, 2})).sum());
      optimizer->step();
      scheduler->step();
      optimizer->zero_grad();
      if (pg.rank() == 0) lrs.push_back(optimizer->param_groups()[0].options().get_lr());
    }
  });
  return lrs;
}

TEST(SchedulerStepping, AnAllAutoConfigSchedulerTakesAcceleratesDummySchedulerValues) {
  auto explicit_lrs = [](int64_t total, int64_t warmup) {
    auto model = torch::nn::Linear(2, 1);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.4));
    WarmupDecayLROptions options;
    options.warmup_min_lr = 0.0;
    options.warmup_max_lr = 0.4;
    options.warmup_num_steps = warmup;
    options.total_num_steps = total;
    options.warmup_type = WarmupType::kLinear;
    WarmupDecayLR scheduler(sgd, options);
    std::vector<double> lrs;
    for (int i = 0; i < 12; ++i) {
      scheduler.step();
      lrs.push_back(scheduler.get_last_lr()[0]);
    }
    return lrs;
  };
  for (int world : {1, 3}) {
    EXPECT_EQ(config_schedule(world, 10, 4), explicit_lrs(10, 4)) << "world " << world;
  }
  // DummyScheduler's default warmup of 0 becomes 1, as Accelerate makes it.
  EXPECT_EQ(config_schedule(2, 10, 0), explicit_lrs(10, 1));
  // An "auto" total needs the run's steps.
  EXPECT_THROW(config_schedule(1, 0, 4), UsageError);
}

// split_batches: the loader's batch_size is the global batch; each process
// takes its slice, and the micro batch of the batch triple is the slice.
TEST(PreparedLoaderSharding, SplitAndDispatchBatchesDealAsAcceleratesLoaders) {
  std::vector<std::vector<std::vector<int64_t>>> split(2), dispatched(2);
  for (bool dispatch : {false, true}) {
    AcceleratorOptions options;
    options.split_batches = !dispatch;
    options.dispatch_batches = dispatch;
    run_ranks(2, [&](ProcessGroup& pg) {
      Accelerator accelerator(pg.shared_from_this(), Config{}, options);
      DistributedLoaderOptions loader_options;
      loader_options.batch_size = dispatch ? 2 : 4;
      loader_options.shuffle = false;
      auto loader = accelerator.prepare_data_loader({at::arange(10)}, loader_options);
      auto& mine = (dispatch ? dispatched : split)[static_cast<size_t>(pg.rank())];
      for (auto batch = loader->next(); batch; batch = loader->next()) {
        const auto t = (*batch)[0].contiguous();
        mine.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
      }
      if (!dispatch) {
        EXPECT_EQ(accelerator.config().train_micro_batch_size_per_gpu, 2);
      }
    });
  }
  // Global batches [0..3], [4..7], [8, 9 + 0, 1]: rank 0 the first half.
  using B = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(split[0], (B{{0, 1}, {4, 5}, {8, 9}}));
  EXPECT_EQ(split[1], (B{{2, 3}, {6, 7}, {0, 1}}));
  // Two batches of 2 joined, then halved; the short last join [8, 9] halved.
  EXPECT_EQ(dispatched[0], (B{{0, 1}, {4, 5}, {8}}));
  EXPECT_EQ(dispatched[1], (B{{2, 3}, {6, 7}, {9}}));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// DeepSpeed's csv_monitor block: after every optimizer step the main process
// writes Train/Samples/{train_loss,lr} at global samples (steps x the global
// batch) under output_path/job_name, plus what the program logs; log_with
// "csv" writes the program's metrics beside init_trackers()'s file, and
// get_tracker hands out the writers.
TEST(DeepSpeedMonitors, CsvMonitorWritesTrainSamplesEventsAtGlobalSamples) {
  testing::TempDir dir;
  Config config;
  config.csv_monitor.enabled = true;
  config.csv_monitor.output_path = dir.path();
  config.csv_monitor.job_name = "job";
  AcceleratorOptions options;
  options.log_with = {"csv"};
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, options);
    auto model = torch::nn::Linear(2, 1);
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                   torch::optim::SGDOptions(0.5));
    DistributedLoaderOptions loader_options;
    loader_options.batch_size = 3;
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {torch::ones({12, 2})},
                                                   loader_options);
    accelerator.init_trackers(dir.path() + "/metrics.jsonl");
    for (int step = 0; step < 2; ++step) {
      auto batch = loader->next();
      accelerator.backward(model((*batch)[0]).sum() * 0 + (pg.rank() + 1.0));
      optimizer->step();
      optimizer->zero_grad();
    }
    accelerator.log({{"eval/accuracy", 0.75}}, 2);
    if (pg.rank() == 0) {
      ASSERT_NE(accelerator.get_tracker<CsvWriter>("csv"), nullptr);
      EXPECT_THROW(accelerator.get_tracker<TensorBoardWriter>("tensorboard"), UsageError);
    } else {
      EXPECT_EQ(accelerator.get_tracker<CsvWriter>("csv"), nullptr);
    }
    accelerator.end_training();
  });
  // Global batch 3 x 2 = 6 samples per step; rank 0's loss is 1. Lines end
  // in \r\n, as Python's csv.writer ends them.
  EXPECT_EQ(read_text(dir.path() + "/job/Train_Samples_lr.csv"),
            "step,lr\r\n6,0.5\r\n12,0.5\r\n");
  EXPECT_EQ(read_text(dir.path() + "/job/Train_Samples_train_loss.csv"),
            "step,train_loss\r\n6,1.0\r\n12,1.0\r\n");
  EXPECT_EQ(read_text(dir.path() + "/job/eval_accuracy.csv"), "step,accuracy\r\n2,0.75\r\n");
  EXPECT_EQ(read_text(dir.path() + "/eval_accuracy.csv"), "step,accuracy\r\n2,0.75\r\n");
}

// A tag with a comma, a quote or a line break is quoted as csv.writer
// quotes it (the header stays two columns).
TEST(CsvWriter, QuotesTagsAsPythonsCsvWriter) {
  testing::TempDir dir;
  {
    CsvWriter writer(dir.path());
    writer.add_scalar("eval/x,y", 1.5, 3);
    writer.add_scalar("q\"t", 2.0, 4);
  }
  EXPECT_EQ(read_text(dir.path() + "/eval_x,y.csv"), "step,\"x,y\"\r\n3,1.5\r\n");
  EXPECT_EQ(read_text(dir.path() + "/q\"t.csv"), "step,\"q\"\"t\"\r\n4,2.0\r\n");
}

// A model and an optimizer, prepared: what save_state() needs.
void prepare_linear(Accelerator& accelerator) {
  auto model = torch::nn::Linear(2, 1);
  accelerator.prepare_model(model);
  accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
      model->parameters(), torch::optim::SGDOptions(0.1)));
}

// ProjectConfiguration(automatic_checkpoint_naming, total_limit, iteration):
// save_state() writes project_dir/checkpoints/checkpoint_<iteration>, keeps
// total_limit of them, and load_state() resumes from the highest, the next
// save continuing after it.
TEST(ProjectConfiguration, AutomaticCheckpointNamingCountsKeepsTheLimitAndResumes) {
  testing::TempDir dir;
  AcceleratorOptions options;
  options.project_dir = dir.path();
  options.automatic_checkpoint_naming = true;
  options.total_limit = 2;
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    prepare_linear(accelerator);
    EXPECT_THROW(accelerator.load_state(), UsageError);  // nothing saved yet
    for (int i = 0; i < 3; ++i) accelerator.save_state();
    EXPECT_EQ(accelerator.save_iteration(), 3);
  });
  EXPECT_EQ(checkpoint_tags(dir.path() + "/checkpoints"),
            (std::vector<std::string>{"checkpoint_1", "checkpoint_2"}));
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    prepare_linear(accelerator);
    // iteration 0 again: its checkpoint_0 is gone, so saving would not
    // collide, but checkpoint_1 would; load_state() moves past both.
    accelerator.load_state();
    EXPECT_EQ(accelerator.save_iteration(), 3);
    accelerator.save_state();
  });
  EXPECT_EQ(checkpoint_tags(dir.path() + "/checkpoints"),
            (std::vector<std::string>{"checkpoint_2", "checkpoint_3"}));
  // Without the option there is no directory to default to.
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{}, AcceleratorOptions{});
    EXPECT_THROW(accelerator.save_state(), UsageError);
  });
}

}  // namespace
}  // namespace tandem
