// Exact resume: training N steps straight equals training k steps, saving,
// building everything again, loading and training N - k steps, byte for
// byte (parameters, optimizer state, scaler, scheduler, data position),
// for DDP and ZeRO 1/2/3 with gradient accumulation and loss scaling, from
// the middle of an epoch. Ranks run as threads; the demo's end-to-end test
// does the same with real processes.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/checkpoint_testing.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"

namespace tandem {
namespace {

using TempDir = testing::ScratchDir;

struct Segment {
  int stage = 0;
  int world = 2;
  int64_t stop_at = 5;       // optimizer steps
  int64_t save_at = -1;      // also save_state(dir) after this step
  bool resume = false;       // load_state(dir) first
  std::string final_dir;     // save_state() here at the end
  bool bf16 = false;
  int64_t num_workers = 0;   // loader worker threads
};

// 48 samples, 4 per rank per micro-batch, 2 micro-batches per step: an
// epoch is 3 optimizer steps at world 2, so step 2 ends mid-epoch.
void train(const Segment& s, const std::string& dir) {
  testing::Recipe r;
  Config config;
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  config.zero.stage = s.stage;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 150;
  AcceleratorOptions options;
  options.loss_scaling = LossScaleConfig{};
  auto gen = at::detail::createCPUGenerator(5);
  const auto x = torch::randn({48, r.in}, gen);
  const auto y = torch::randint(0, r.out, {48}, gen);
  testing::run_ranks(s.world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, options);
    testing::Stack model = testing::make_model(r);
    if (s.bf16) model->to(torch::kBFloat16);
    auto adamw = std::make_shared<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(1e-2));
    auto step_lr = std::make_shared<torch::optim::StepLR>(*adamw, /*step_size=*/2, /*gamma=*/0.5);
    DistributedLoaderOptions loader_options;
    loader_options.batch_size = 4;
    loader_options.seed = 11;
    loader_options.num_workers = s.num_workers;
    accelerator.prepare_model(model);
    auto loader = accelerator.prepare_data_loader({x, y}, loader_options);
    auto optimizer = accelerator.prepare_optimizer(adamw);
    auto scheduler = accelerator.prepare_scheduler(step_lr);
    if (s.resume) {
      const auto client = accelerator.load_state(dir);
      EXPECT_EQ(client.value("note", ""), "mid-epoch");
    }
    for (int64_t epoch = loader->epoch(); accelerator.step() < s.stop_at; ++epoch) {
      loader->set_epoch(epoch);
      for (auto& batch : *loader) {
        optimizer->zero_grad();
        auto input = batch[0].to(s.bf16 ? torch::kBFloat16 : torch::kFloat);
        auto loss = torch::nn::functional::cross_entropy(model->forward(input).to(torch::kFloat),
                                                         batch[1]);
        accelerator.backward(loss);
        optimizer->step();
        scheduler->step();
        if (!accelerator.sync_gradients()) continue;
        if (accelerator.step() == s.save_at) {
          SaveStateOptions save;
          save.client_state = {{"note", "mid-epoch"}};
          accelerator.save_state(dir, save);
        }
        if (accelerator.step() >= s.stop_at) break;
      }
    }
    accelerator.save_state(s.final_dir);
  });
}

void expect_exact_resume(int stage, bool bf16 = false, int64_t num_workers = 0) {
  TempDir straight, interrupted, resumed;
  Segment a;
  a.stage = stage;
  a.bf16 = bf16;
  a.num_workers = num_workers;
  a.final_dir = straight.path();
  train(a, "");

  Segment first = a;
  first.stop_at = 2;
  first.save_at = 2;
  first.final_dir = interrupted / "unused";
  train(first, interrupted.path());
  Segment second = a;
  second.resume = true;
  second.final_dir = resumed.path();
  train(second, interrupted.path());

  EXPECT_TRUE(testing::same_tensors(testing::rank_files(straight.path(), "global_step5"),
                                    testing::rank_files(resumed.path(), "global_step5")));
  const auto meta_a = read_checkpoint_meta(straight / "global_step5");
  const auto meta_b = read_checkpoint_meta(resumed / "global_step5");
  for (const char* key : {"optimizer", "schedulers", "scaler", "loader", "gradient_state"}) {
    EXPECT_EQ(meta_a[key], meta_b[key]) << key;
  }
  EXPECT_EQ(meta_a["loader"]["position"], 4) << "step 5 ends mid-epoch 1";
}

TEST(ExactResume, DdpMidEpochWithAccumulationAndLossScaling) { expect_exact_resume(0); }
TEST(ExactResume, Zero1MidEpoch) { expect_exact_resume(1); }
TEST(ExactResume, Zero2MidEpoch) { expect_exact_resume(2); }
TEST(ExactResume, Zero3MidEpoch) { expect_exact_resume(3); }
TEST(ExactResume, Bf16MasterWeightsDdpAndZero2) {
  expect_exact_resume(0, /*bf16=*/true);
  expect_exact_resume(2, /*bf16=*/true);
}

// Worker threads build batches out of order; the loader hands them out in
// order, so a resumed pass continues exactly where the saved one stopped.
TEST(ExactResume, MidEpochWithThreeLoaderWorkers) {
  expect_exact_resume(0, /*bf16=*/false, /*num_workers=*/3);
  expect_exact_resume(2, /*bf16=*/false, /*num_workers=*/3);
}

TEST(ExactResume, SaveInTheMiddleOfAccumulationIsRefused) {
  TempDir dir;
  testing::run_ranks(1, [&](ProcessGroup& pg) {
    Config config;
    config.gradient_accumulation_steps = 2;
    Accelerator accelerator(pg.shared_from_this(), config);
    testing::Recipe r;
    testing::Stack model = testing::make_model(r);
    auto adam = std::make_shared<torch::optim::Adam>(model->parameters());
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    accelerator.backward(model->forward(torch::ones({2, r.in})).sum());
    optimizer->step();  // micro-step 1 of 2: no step
    EXPECT_THROW(accelerator.save_state(dir.path()), UsageError);
    EXPECT_FALSE(Accelerator::has_checkpoint(dir.path()));
  });
}

// Without a prepared model there are no weights to save: a clear refusal
// (it was a crash), and nothing written.
TEST(ExactResume, SaveWithoutAPreparedModelIsRefused) {
  TempDir dir;
  testing::run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    auto loader = accelerator.prepare_data_loader({torch::arange(4, torch::kLong)}, 2);
    const std::string message =
        testing::usage_error_message([&] { accelerator.save_state(dir.path()); });
    EXPECT_NE(message.find("no model is prepared"), std::string::npos) << message;
    EXPECT_FALSE(Accelerator::has_checkpoint(dir.path()));
  });
}

// An optimizer that also holds a tensor outside the model: save_state and
// load_state name it (shape) and the fix, instead of a bare std::out_of_range.
TEST(ExactResume, AnOptimizerTensorOutsideTheModelIsNamedOnSaveAndLoad) {
  TempDir dir;
  testing::run_ranks(1, [&](ProcessGroup& pg) {
    testing::Recipe r;
    {
      Accelerator accelerator(pg.shared_from_this(), Config{});
      testing::Stack model = testing::make_model(r);
      auto adam = std::make_shared<torch::optim::Adam>(model->parameters());
      accelerator.prepare_model(model);
      auto optimizer = accelerator.prepare_optimizer(adam);
      accelerator.backward(model->forward(torch::ones({2, r.in})).sum());
      optimizer->step();
      accelerator.save_state(dir.path());
    }
    Accelerator accelerator(pg.shared_from_this(), Config{});
    testing::Stack model = testing::make_model(r);
    auto params = model->parameters();
    params.push_back(torch::zeros({3, 7}, torch::requires_grad()));
    auto adam = std::make_shared<torch::optim::Adam>(params);
    accelerator.prepare_model(model);
    auto optimizer = accelerator.prepare_optimizer(adam);
    accelerator.backward(model->forward(torch::ones({2, r.in})).sum());
    optimizer->step();
    try {
      accelerator.load_state(dir.path());
      ADD_FAILURE() << "load_state accepted an optimizer tensor outside the model";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("load_state: the optimizer holds a tensor of shape 3x7 "
                                           "that is not a parameter of a prepared model"),
                std::string::npos)
          << e.what();
    }
    TempDir other;
    try {
      accelerator.save_state(other.path());
      ADD_FAILURE() << "save_state accepted an optimizer tensor outside the model";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("save_state: the optimizer holds a tensor of shape 3x7"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace tandem
