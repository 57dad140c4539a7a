// Several models, optimizers and schedulers per Accelerator: a two-player
// GAN at world 2 trains like world 1 on the concatenated batch (DDP and
// ZeRO), a frozen encoder with a trained head, save_state/load_state of
// everything resume bit-exactly, and the mistakes multi-model loops invite
// are refused clearly.

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <optional>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "support/zero_test_models.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/optim/lr_scheduler.h"
#include "tandem/zero/sharded.h"

namespace tandem {
namespace {

using testing::Params;
using testing::run_ranks;

// A hidden layer, the unit ZeRO-3 shards in both players.
struct HiddenImpl : torch::nn::Module {
  HiddenImpl() { fc = register_module("fc", torch::nn::Linear(16, 16)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::leaky_relu(fc(x), 0.2); }
  torch::nn::Linear fc{nullptr};
};

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 16));
    hidden = register_module("hidden", Sharded<HiddenImpl>());
    fc2 = register_module("fc2", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    return fc2(hidden->forward(torch::relu(fc1(z))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Sharded<HiddenImpl> hidden{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(2, 16));
    hidden = register_module("hidden", Sharded<HiddenImpl>());
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(hidden->forward(torch::leaky_relu(fc1(x), 0.2)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Sharded<HiddenImpl> hidden{nullptr};
};
TORCH_MODULE(Discriminator);

// The same initial players on every call. It seeds and draws from the global
// generator: call it before rank threads start, never inside one.
std::pair<Generator, Discriminator> make_players() {
  torch::manual_seed(21);
  Generator g;
  Discriminator d;
  return {g, d};
}

struct GanData {
  torch::Tensor real, noise;
};

GanData gan_data() {
  auto gen = at::detail::createCPUGenerator(7);
  return {torch::randn({72, 2}, gen) * 0.5 + 1.0, torch::randn({72, 4}, gen)};
}

struct GanOptions {
  int world = 1;
  int stage = 0;
  bool guard = false;         // both backwards under one accumulate(g, d)
  int stop_after = -1;        // leave the loop after this many iterations
  std::string save_to;        // save_state() there when stopping
  std::string load_from;      // load_state() before the loop
};

GanOptions run_at(int world, int stage) {
  GanOptions o;
  o.world = world;
  o.stage = stage;
  return o;
}

struct GanResult {
  Params g, d;
  int64_t steps = 0;
  double d_lr = 0, g_lr = 0;
};

Params whole_params(Accelerator& accelerator, const std::shared_ptr<torch::nn::Module>& model) {
  std::optional<ZeroOptimizer::GatheredParameters> whole;
  if (auto zero = accelerator.zero_optimizer(model); zero && zero->stage() == 3) {
    whole.emplace(*zero);
  }
  return testing::snapshot(*model);
}

// Alternating discriminator and generator steps over 6 batches of 12
// samples (12 / world per rank), Adam for both, a LibTorch StepLR for the
// discriminator and a tandem WarmupLR for the generator.
GanResult train_gan(const GanOptions& o) {
  const GanData data = gan_data();
  Config config;
  config.zero.stage = o.stage;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 64;  // several buckets even for these sizes
  GanResult out;
  std::vector<std::pair<Generator, Discriminator>> players;  // one pair per rank
  for (int r = 0; r < o.world; ++r) players.push_back(make_players());
  // split_batches: the loader's 12 rows are the global batch at every world
  // size, and each scheduler steps once per optimizer step (Accelerate's
  // rule), so worlds 1, 2 and 3 train alike.
  AcceleratorOptions options;
  options.split_batches = true;
  run_ranks(o.world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config, options);
    auto [g, d] = players[static_cast<size_t>(pg.rank())];
    accelerator.prepare_model(g);
    accelerator.prepare_model(d);
    auto g_opt = accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(
        g->parameters(), torch::optim::AdamOptions(1e-2).betas({0.5, 0.999})));
    auto d_opt = accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(
        d->parameters(), torch::optim::AdamOptions(2e-2).betas({0.5, 0.999})));
    auto d_sched = accelerator.prepare_scheduler(
        std::make_shared<torch::optim::StepLR>(*d_opt, 2, 0.5), d_opt);
    WarmupLROptions warmup;
    warmup.warmup_num_steps = 4;
    warmup.warmup_type = WarmupType::kLinear;
    auto g_sched = accelerator.prepare_scheduler(std::make_shared<WarmupLR>(*g_opt, warmup));
    DistributedLoaderOptions loader_options;
    loader_options.batch_size = 12;
    loader_options.shuffle = false;
    auto loader = accelerator.prepare_data_loader({data.real, data.noise}, loader_options);
    if (!o.load_from.empty()) accelerator.load_state(o.load_from);

    auto iteration = [&](const torch::Tensor& real, const torch::Tensor& z) {
      const auto ones = torch::ones({real.size(0), 1});
      const auto zeros = torch::zeros({real.size(0), 1});
      namespace F = torch::nn::functional;
      d_opt->zero_grad();
      const auto fake = g->forward(z);
      // Reaches the discriminator only.
      accelerator.backward(F::binary_cross_entropy_with_logits(d->forward(real), ones) +
                           F::binary_cross_entropy_with_logits(d->forward(fake.detach()), zeros));
      d_opt->step();
      d_sched->step();
      g_opt->zero_grad();
      // Reaches both; the discriminator's gradients are dropped by its next
      // zero_grad().
      accelerator.backward(F::binary_cross_entropy_with_logits(d->forward(fake), ones));
      g_opt->step();
      g_sched->step();
    };
    int done = 0;
    for (auto& batch : *loader) {
      if (o.guard) {
        auto guard = accelerator.accumulate(g, d);
        iteration(batch[0], batch[1]);
      } else {
        iteration(batch[0], batch[1]);
      }
      if (++done == o.stop_after) {
        if (!o.save_to.empty()) accelerator.save_state(o.save_to);
        break;
      }
    }
    Params gp = whole_params(accelerator, g.ptr());
    Params dp = whole_params(accelerator, d.ptr());
    if (pg.rank() == 0) {
      out.g = std::move(gp);
      out.d = std::move(dp);
      out.steps = accelerator.step();
      out.d_lr = d_opt->param_groups().front().options().get_lr();
      out.g_lr = g_opt->param_groups().front().options().get_lr();
    }
  });
  return out;
}

TEST(MultiModel, AGanAtWorldTwoTrainsLikeWorldOneOnTheConcatenatedBatch) {
  for (int stage : {0, 2, 3}) {
    const GanResult one = train_gan(run_at(1, stage));
    EXPECT_EQ(one.steps, 6) << "step() counts iterations: each optimizer stepped 6 times";
    for (int world : {2, 3}) {
      const GanResult two = train_gan(run_at(world, stage));
      EXPECT_EQ(two.steps, 6);
      EXPECT_LT(testing::max_relative_diff(two.g, one.g), 1e-5)
          << "stage " << stage << " world " << world;
      EXPECT_LT(testing::max_relative_diff(two.d, one.d), 1e-5)
          << "stage " << stage << " world " << world;
      // Each scheduler followed its own optimizer, one step per iteration:
      // StepLR(2, 0.5) as after 6 steps of its own, WarmupLR at its peak
      // (Adam's 1e-2) after 4.
      auto probe = torch::zeros({1}, torch::requires_grad());
      torch::optim::SGD reference({probe}, torch::optim::SGDOptions(2e-2));
      torch::optim::StepLR step_lr(reference, 2, 0.5);
      for (int i = 0; i < 6; ++i) step_lr.step();
      EXPECT_DOUBLE_EQ(two.d_lr, reference.param_groups().front().options().get_lr());
      EXPECT_DOUBLE_EQ(two.g_lr, 1e-2);
    }
  }
  // The players did train: neither is where it started.
  auto [g0, d0] = make_players();
  const GanResult trained = train_gan(run_at(2, 0));
  EXPECT_GT(testing::max_relative_diff(trained.g, testing::snapshot(*g0)), 1e-2);
  EXPECT_GT(testing::max_relative_diff(trained.d, testing::snapshot(*d0)), 1e-2);
}

TEST(MultiModel, OneAccumulateGuardCoversBothPlayersBackwards) {
  // With gradient_accumulation_steps 1 the guard changes nothing: the
  // generator's zero_grad() after the discriminator's backward still clears
  // its own stale gradients.
  const GanResult plain = train_gan(run_at(2, 0));
  GanOptions guarded = run_at(2, 0);
  guarded.guard = true;
  const GanResult with_guard = train_gan(guarded);
  EXPECT_LT(testing::max_relative_diff(with_guard.g, plain.g), 1e-6);
  EXPECT_LT(testing::max_relative_diff(with_guard.d, plain.d), 1e-6);
}

TEST(MultiModel, SaveAndLoadStateCoverEveryModelOptimizerAndSchedulerBitExactly) {
  for (int stage : {0, 2, 3}) {
    const GanResult straight = train_gan(run_at(2, stage));
    testing::ScratchDir dir;
    GanOptions first = run_at(2, stage);
    first.stop_after = 3;
    first.save_to = dir.path();
    train_gan(first);
    GanOptions second = run_at(2, stage);
    second.load_from = dir.path();
    const GanResult resumed = train_gan(second);
    EXPECT_EQ(resumed.steps, 6) << "stage " << stage;
    EXPECT_DOUBLE_EQ(resumed.d_lr, straight.d_lr);
    EXPECT_DOUBLE_EQ(resumed.g_lr, straight.g_lr);
    for (const auto& [name, p] : straight.g) {
      EXPECT_TRUE(torch::equal(resumed.g.at(name), p)) << "stage " << stage << " generator " << name;
    }
    for (const auto& [name, p] : straight.d) {
      EXPECT_TRUE(torch::equal(resumed.d.at(name), p)) << "stage " << stage << " discriminator "
                                                       << name;
    }
  }
}

// ---- A frozen encoder with a trained head ----------------------------------

struct FrozenResult {
  Params encoder, head;
  Params encoder_rank1;
};

// The encoder is prepared as its own model, frozen; only the head has an
// optimizer. Rank 1 builds its encoder from other values: preparing must
// give every rank rank 0's.
FrozenResult train_frozen(int world, int stage) {
  auto gen = at::detail::createCPUGenerator(13);
  const auto x = torch::randn({36, 6}, gen);
  const auto y = torch::randn({36, 3}, gen);
  const auto encoder_init = torch::randn({16, 6}, gen);
  Config config;
  config.zero.stage = stage;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  config.zero.reduce_bucket_size = 32;
  FrozenResult out;
  std::mutex mutex;
  // Built before the rank threads (they draw from the global generator).
  std::vector<std::pair<torch::nn::Linear, torch::nn::Linear>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(3);
    models.emplace_back(torch::nn::Linear(6, 16), torch::nn::Linear(16, 3));
  }
  run_ranks(world, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), config);
    auto [encoder, head] = models[static_cast<size_t>(pg.rank())];
    {
      torch::NoGradGuard no_grad;
      encoder->weight.copy_(encoder_init * (pg.rank() == 1 ? -1.0 : 1.0));
    }
    encoder->weight.requires_grad_(false);
    encoder->bias.requires_grad_(false);
    accelerator.prepare_model(encoder);
    accelerator.prepare_model(head);
    auto optimizer = accelerator.prepare_optimizer(
        std::make_shared<torch::optim::Adam>(head->parameters(), torch::optim::AdamOptions(1e-2)));
    DistributedLoaderOptions options;
    options.batch_size = 12 / world;
    options.shuffle = false;
    auto loader = accelerator.prepare_data_loader({x, y}, options);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      const auto features = torch::relu(encoder->forward(batch[0]));
      accelerator.backward(torch::mse_loss(head->forward(features), batch[1]));
      optimizer->step();
    }
    Params h = whole_params(accelerator, head.ptr());
    std::lock_guard<std::mutex> lock(mutex);
    if (pg.rank() == 0) {
      out.encoder = testing::snapshot(*encoder);
      out.head = std::move(h);
    } else if (pg.rank() == 1) {
      out.encoder_rank1 = testing::snapshot(*encoder);
    }
  });
  return out;
}

TEST(MultiModel, AFrozenEncoderWithATrainedHeadUnderDdpAndZero2) {
  for (int stage : {0, 2}) {
    const FrozenResult one = train_frozen(1, stage);
    const FrozenResult two = train_frozen(3, stage);
    EXPECT_LT(testing::max_relative_diff(two.head, one.head), 1e-5) << "stage " << stage;
    for (const auto& [name, p] : one.encoder) {
      EXPECT_TRUE(torch::equal(two.encoder.at(name), p)) << "the frozen encoder never moves";
      EXPECT_TRUE(torch::equal(two.encoder_rank1.at(name), p))
          << "stage " << stage << ": rank 1 starts from rank 0's encoder (" << name << ")";
    }
  }
}

// ---- Mistakes, refused clearly ---------------------------------------------

TEST(MultiModel, RefusesWhatSeveralModelsMakeAmbiguous) {
  Accelerator accelerator(ProcessGroup::create(c10::make_intrusive<c10d::HashStore>(), 0, 1),
                          Config{});
  auto [g, d] = make_players();
  accelerator.prepare_model(g);
  EXPECT_THROW(accelerator.prepare_model(g), UsageError) << "the same model twice";
  accelerator.prepare_model(d);
  auto g_opt = accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(g->parameters()));
  EXPECT_THROW(accelerator.prepare_optimizer(std::make_shared<torch::optim::SGD>(
                   g->parameters(), torch::optim::SGDOptions(0.1))),
               UsageError)
      << "a parameter in two optimizers";
  auto d_opt = accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(d->parameters()));
  EXPECT_THROW(accelerator.prepare_scheduler(std::make_shared<torch::optim::StepLR>(*d_opt, 1)),
               UsageError)
      << "a LibTorch scheduler with two optimizers must name its optimizer";
  EXPECT_THROW(accelerator.clip_grad_norm(1.0), UsageError) << "which optimizer to clip";
  EXPECT_THROW(accelerator.prepare_optimizer_from_config(), UsageError) << "which model";
  Generator stranger;
  EXPECT_THROW((void)accelerator.accumulate(g, stranger), UsageError);
  EXPECT_NO_THROW((void)accelerator.accumulate(g, d));
  EXPECT_EQ(accelerator.unwrap_model(), g.ptr()) << "the first prepared model";
}

TEST(MultiModel, UnderZeroAnOptimizerMustShardOneModel) {
  Config config;
  config.zero.stage = 2;
  config.zero.stage3_param_persistence_threshold = 0;  // tiny models: shard all
  Accelerator accelerator(ProcessGroup::create(c10::make_intrusive<c10d::HashStore>(), 0, 1),
                          config);
  auto [g, d] = make_players();
  accelerator.prepare_model(g);
  accelerator.prepare_model(d);
  std::vector<torch::Tensor> both = g->parameters();
  for (const auto& p : d->parameters()) both.push_back(p);
  EXPECT_THROW(accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(both)),
               UsageError);
}

// Across ranks, an optimizer over a model that was never prepared would
// update each rank's copy from its own gradient: refused at the first
// backward, naming the optimizer, under DDP as ZeRO refuses it at prepare.
// One process has nothing to drift apart, and the order of the prepare calls
// stays free.
TEST(MultiModel, AnOptimizerOverAnUnpreparedModelIsRefusedAcrossRanks) {
  // Players per rank, built before the threads (make_players seeds).
  std::vector<std::pair<Generator, Discriminator>> players;
  for (int r = 0; r < 4; ++r) players.push_back(make_players());
  const auto errors = testing::rank_errors<UsageError>(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    auto [g, d] = players[static_cast<std::size_t>(pg.rank())];
    auto d_opt =
        accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(d->parameters()));
    accelerator.prepare_model(g);  // d is never prepared
    auto g_opt =
        accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(g->parameters()));
    accelerator.backward(g->forward(torch::ones({2, 4})).sum());
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const auto& [rank, error] : errors) {
    EXPECT_NE(error.find("prepared optimizer 0 steps a parameter"), std::string::npos) << error;
    EXPECT_NE(error.find("no prepared model holds"), std::string::npos) << error;
  }
  testing::run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    Generator g = players[2 + static_cast<std::size_t>(pg.rank())].first;
    auto g_opt =
        accelerator.prepare_optimizer(std::make_shared<torch::optim::Adam>(g->parameters()));
    accelerator.prepare_model(g);  // optimizer first is fine
    EXPECT_NO_THROW(accelerator.backward(g->forward(torch::ones({2, 4})).sum()));
  });
}

}  // namespace
}  // namespace tandem
