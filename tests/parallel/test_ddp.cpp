// DistributedDataParallel: parity with single-process training on the
// concatenated batch is the main evidence; the rest pins down buckets,
// no_sync, unused parameters and model checks.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "support/ddp_test_models.h"
#include "support/thread_ranks.h"
#include "tandem/core/cpu_allocator.h"
#include "tandem/core/error.h"
#include "tandem/parallel/ddp.h"

namespace tandem {
namespace {

using testing::copy_state;
using testing::max_relative_diff;
using testing::Mlp;
using testing::run_ranks;

constexpr int kIn = 12, kHidden = 24, kOut = 5;

struct Data {
  std::vector<torch::Tensor> inputs;  // per step, the whole global batch
  std::vector<torch::Tensor> labels;
};

Data make_data(int steps, int global_batch) {
  torch::manual_seed(123);
  Data d;
  for (int s = 0; s < steps; ++s) {
    d.inputs.push_back(torch::randn({global_batch, kIn}));
    d.labels.push_back(torch::randint(0, kOut, {global_batch}));
  }
  return d;
}

// The same initial weights on every call. It seeds and draws from torch's
// global generator, which rank threads share: call it before they start,
// never inside one.
Mlp reference_init() {
  torch::manual_seed(7);
  return Mlp(kIn, kHidden, kOut);
}

// One model per rank, each with the reference's initial weights. Built
// before the rank threads start: constructing a module draws from the
// global generator too.
std::vector<Mlp> reference_replicas(int world) {
  const Mlp init = reference_init();
  std::vector<Mlp> replicas;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(Mlp(kIn, kHidden, kOut));
    copy_state(*replicas.back(), *init);
  }
  return replicas;
}

// Trains a fresh copy of the reference model on the full batches.
Mlp train_single(const Data& data, int steps) {
  Mlp model = reference_replicas(1)[0];
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model(data.inputs[s]), data.labels[s]).backward();
    opt.step();
  }
  return model;
}

// Every rank starts from a different init (DDP must broadcast rank 0's) and
// trains `model`, a copy of the reference, on its slice of each global batch.
void train_ddp(ProcessGroup& pg, const Data& data, int steps, const DDPOptions& options,
               Mlp& model) {
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(static_cast<float>(pg.rank()));
  }
  DistributedDataParallel ddp(model, pg.shared_from_this(), options);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  const int64_t b = data.inputs[0].size(0) / pg.world_size();
  for (int s = 0; s < steps; ++s) {
    auto x = data.inputs[s].narrow(0, pg.rank() * b, b);
    auto y = data.labels[s].narrow(0, pg.rank() * b, b);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model(x), y).backward();
    opt.step();
  }
}

class DdpParity : public ::testing::TestWithParam<std::tuple<int, double>> {};

TEST_P(DdpParity, MlpMatchesSingleProcessOnTheConcatenatedBatch) {
  const auto [world, bucket_mb] = GetParam();
  const int steps = 6, per_rank = 4;
  Data data = make_data(steps, world * per_rank);
  Mlp expected = train_single(data, steps);
  DDPOptions options;
  options.bucket_cap_mb = bucket_mb;
  options.first_bucket_cap_mb = bucket_mb;
  std::vector<Mlp> trained = reference_replicas(world);
  run_ranks(world, [&](ProcessGroup& pg) { train_ddp(pg, data, steps, options, trained[pg.rank()]); });
  for (int r = 0; r < world; ++r) {
    EXPECT_LT(max_relative_diff(*trained[r], *expected), 1e-5) << "rank " << r;
  }
}

// Default caps (one bucket here) and a tiny cap (one parameter per bucket).
INSTANTIATE_TEST_SUITE_P(Worlds, DdpParity,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(25.0, 1e-4)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) < 1 ? "_tiny_buckets" : "_default_buckets");
                         });

// The caching CPU allocator is process-wide, so it is opt-in: a default DDP
// wrapper leaves LibTorch's CPU allocator as it was. (No test in this binary
// opts in.)
TEST(Ddp, DefaultOptionsLeaveTheProcessCpuAllocatorAlone) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto model = std::make_shared<torch::nn::LinearImpl>(4, 2);
    DistributedDataParallel ddp(model, pg.shared_from_this());
    EXPECT_FALSE(DDPOptions{}.cache_cpu_allocations);
    EXPECT_FALSE(cpu_caching_allocator_enabled());
  });
}

TEST(Ddp, TinyCapGivesOneBucketPerParameterInReverseOrder) {
  run_ranks(2, [](ProcessGroup& pg) {
    Mlp model(kIn, kHidden, kOut);
    DDPOptions options;
    options.bucket_cap_mb = 1e-6;
    options.first_bucket_cap_mb = 1e-6;
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    auto buckets = ddp.bucket_parameter_names();
    ASSERT_EQ(buckets.size(), 6u);
    EXPECT_EQ(buckets.front(), std::vector<std::string>{"fc3.bias"});
    EXPECT_EQ(buckets.back(), std::vector<std::string>{"fc1.weight"});
  });
}

// Registered a, b, c but applied c(b(a(x))) in reverse: the gradient of `a`
// (applied last) arrives first.
struct ShuffledImpl : torch::nn::Module {
  ShuffledImpl() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
    c = register_module("c", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(torch::Tensor x) { return a(torch::relu(b(torch::relu(c(x))))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Shuffled);

TEST(Ddp, BucketsAreRebuiltOnceInGradientArrivalOrder) {
  run_ranks(2, [](ProcessGroup& pg) {
    Shuffled model;
    DDPOptions options;
    options.bucket_cap_mb = 1e-6;
    options.first_bucket_cap_mb = 1e-6;
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    EXPECT_FALSE(ddp.buckets_rebuilt());
    EXPECT_EQ(ddp.bucket_parameter_names().front().front(), "c.bias");  // reverse registration
    model(torch::randn({4, 8})).sum().backward();
    EXPECT_TRUE(ddp.buckets_rebuilt());
    auto rebuilt = ddp.bucket_parameter_names();
    ASSERT_EQ(rebuilt.size(), 6u);
    EXPECT_EQ(rebuilt.front().front().substr(0, 2), "a.");  // applied last, ready first
    EXPECT_EQ(rebuilt.back().front().substr(0, 2), "c.");
    // The reduced gradients survived the move into the new buckets.
    auto grad = model->a->weight.grad().clone();
    pg.all_reduce(grad, ReduceOp::kMax);
    EXPECT_TRUE(torch::equal(grad, model->a->weight.grad()));
    model(torch::randn({4, 8})).sum().backward();
    EXPECT_EQ(ddp.bucket_parameter_names(), rebuilt);  // only once
    EXPECT_EQ(ddp.sync_count(), 2);
  });
}

TEST(Ddp, GradientsAreViewsIntoOneFlatBucket) {
  run_ranks(2, [](ProcessGroup& pg) {
    Mlp model(kIn, kHidden, kOut);
    DistributedDataParallel ddp(model, pg.shared_from_this());
    ASSERT_EQ(ddp.bucket_parameter_names().size(), 1u);
    model(torch::randn({3, kIn})).sum().backward();
    auto storage = model->fc1->weight.grad().storage().data();
    for (auto& p : model->parameters()) EXPECT_EQ(p.grad().storage().data(), storage);
    // After zero_grad to None, the next backward copies back into the bucket.
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    model(torch::randn({3, kIn})).sum().backward();
    for (auto& p : model->parameters()) EXPECT_EQ(p.grad().storage().data(), storage);
  });
}

TEST(Ddp, NoSyncAccumulationEqualsOneBigBatch) {
  const int world = 2, per_rank = 3;
  Data data = make_data(2, world * per_rank);
  // Reference: one process accumulating both micro-batches over all ranks' data.
  Mlp reference = reference_replicas(1)[0];
  for (int s = 0; s < 2; ++s) {
    torch::nn::functional::cross_entropy(reference(data.inputs[s]), data.labels[s]).backward();
  }
  // Per rank: the DDP model and a plain copy; built before the threads.
  std::vector<Mlp> models = reference_replicas(world), locals = reference_replicas(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    Mlp model = models[pg.rank()];
    Mlp local = locals[pg.rank()];
    DistributedDataParallel ddp(model, pg.shared_from_this());
    auto slice = [&](int s, const std::vector<torch::Tensor>& v) {
      return v[s].narrow(0, pg.rank() * per_rank, per_rank);
    };
    {
      auto guard = ddp.no_sync();
      torch::nn::functional::cross_entropy(model(slice(0, data.inputs)), slice(0, data.labels)).backward();
    }
    // Nothing was communicated: the gradient is this rank's own.
    torch::nn::functional::cross_entropy(local(slice(0, data.inputs)), slice(0, data.labels)).backward();
    EXPECT_TRUE(torch::allclose(model->fc1->weight.grad(), local->fc1->weight.grad()));
    EXPECT_EQ(ddp.sync_count(), 0);
    torch::nn::functional::cross_entropy(model(slice(1, data.inputs)), slice(1, data.labels)).backward();
    EXPECT_EQ(ddp.sync_count(), 1);
    // Average over ranks of per-rank sums of two micro-batch means equals the
    // sum over micro-batches of the global mean.
    auto ref = reference->named_parameters();
    for (auto& item : model->named_parameters()) {
      EXPECT_TRUE(torch::allclose(item.value().grad(), ref[item.key()].grad(), 1e-5, 1e-6))
          << item.key();
    }
  });
}

struct PartlyUsedImpl : torch::nn::Module {
  PartlyUsedImpl() {
    used = register_module("used", torch::nn::Linear(4, 4));
    spare = register_module("spare", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(torch::Tensor x, bool use_spare) {
    return use_spare ? spare(used(x)) : used(x);
  }
  torch::nn::Linear used{nullptr}, spare{nullptr};
};
TORCH_MODULE(PartlyUsed);

TEST(Ddp, UnusedParametersAreAnErrorThatNamesThemAndTheFix) {
  run_ranks(2, [](ProcessGroup& pg) {
    PartlyUsed model;
    DistributedDataParallel ddp(model, pg.shared_from_this());
    try {
      model->forward(torch::randn({2, 4}), false).sum().backward();
      ADD_FAILURE() << "backward with unused parameters did not throw";
    } catch (const UsageError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("2 parameter(s) received no gradient"), std::string::npos) << what;
      EXPECT_NE(what.find("spare.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("spare.bias"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters"), std::string::npos) << what;
      EXPECT_NE(what.find("[rank " + std::to_string(pg.rank()) + "/2]"), std::string::npos) << what;
    }
  });
}

TEST(Ddp, FindUnusedParametersAveragesWhatSomeRankUsed) {
  run_ranks(2, [](ProcessGroup& pg) {
    PartlyUsed model;
    DDPOptions options;
    options.find_unused_parameters = true;
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    auto x = torch::ones({2, 4});
    // Only rank 0 uses `spare`: both ranks must end with the same gradient.
    model->forward(x, pg.rank() == 0).sum().backward();
    ASSERT_TRUE(model->spare->weight.grad().defined());
    auto g = model->spare->weight.grad().clone();
    auto g_max = g.clone();
    pg.all_reduce(g_max, ReduceOp::kMax);
    EXPECT_TRUE(torch::equal(g, g_max));
    EXPECT_GT(g.abs().sum().item<float>(), 0);
    // Nobody uses it: its gradient stays undefined, as in single-process training.
    PartlyUsed fresh;
    DistributedDataParallel ddp2(fresh, pg.shared_from_this(), options);
    fresh->forward(x, false).sum().backward();
    EXPECT_FALSE(fresh->spare->weight.grad().defined());
  });
}

// A parameter reached only in micro-steps under no_sync (on some ranks, or
// on all) is used for the synchronised backward that follows, as PyTorch's
// DDP counts it: every rank ends with the average of what the ranks hold.
// At world 3 with rank 0 alone using it, that is rank 0's gradient / 3.
TEST(Ddp, FindUnusedParametersCountsWhatNoSyncMicroStepsReached) {
  const int world = 3;
  torch::manual_seed(5);
  PartlyUsed init;
  std::vector<PartlyUsed> models, locals;
  for (int r = 0; r < 2 * world; ++r) {
    PartlyUsed copy;
    testing::copy_state(*copy, *init);
    (r < world ? models : locals).push_back(copy);
  }
  for (const bool every_rank : {false, true}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      PartlyUsed model = models[pg.rank()], local = locals[pg.rank()];
      for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
      for (auto& p : local->parameters()) p.mutable_grad() = torch::Tensor();
      DDPOptions options;
      options.find_unused_parameters = true;
      DistributedDataParallel ddp(model, pg.shared_from_this(), options);
      auto gen = at::detail::createCPUGenerator(40 + pg.rank());
      const auto x0 = torch::randn({3, 4}, gen), x1 = torch::randn({3, 4}, gen);
      const bool spare = every_rank || pg.rank() == 0;
      {
        auto guard = ddp.no_sync();
        model->forward(x0, spare).pow(2).sum().backward();
      }
      model->forward(x1, false).pow(2).sum().backward();  // `spare` unused here
      local->forward(x0, spare).pow(2).sum().backward();
      local->forward(x1, false).pow(2).sum().backward();
      auto ddp_grads = model->named_parameters();
      for (auto& item : local->named_parameters()) {
        const torch::Tensor& held = item.value().grad();
        torch::Tensor expected = held.defined() ? held.clone() : torch::zeros_like(item.value());
        pg.all_reduce(expected, ReduceOp::kSum);
        expected.div_(world);
        const torch::Tensor& got = ddp_grads[item.key()].grad();
        ASSERT_TRUE(got.defined()) << item.key() << " every_rank " << every_rank;
        EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-6))
            << item.key() << " every_rank " << every_rank << " rank " << pg.rank();
      }
    });
  }
}

TEST(Ddp, DifferentModelsAcrossRanksNameTheRankAndParameter) {
  run_ranks(2, [](ProcessGroup& pg) {
    torch::nn::Sequential model(torch::nn::Linear(4, 5),
                                torch::nn::Linear(5, pg.rank() == 0 ? 3 : 2));
    try {
      DistributedDataParallel ddp(model, pg.shared_from_this());
      ADD_FAILURE() << "no error for different models";
    } catch (const UsageError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("rank 1 has a different model than rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("1.weight Float[3, 5]"), std::string::npos) << what;
      EXPECT_NE(what.find("1.weight Float[2, 5]"), std::string::npos) << what;
    }
  });
}

TEST(Ddp, Bf16CompressionHookAveragesWithinBf16Precision) {
  // Per rank: the compressed model and a plain copy; built before the threads.
  std::vector<Mlp> models = reference_replicas(2), plains = reference_replicas(2);
  run_ranks(2, [&](ProcessGroup& pg) {
    Mlp model = models[pg.rank()];
    Mlp plain = plains[pg.rank()];
    DDPOptions compressed;
    compressed.comm_hook = CommHook::kBf16Compress;
    DistributedDataParallel ddp(model, pg.shared_from_this(), compressed);
    DistributedDataParallel ddp_plain(plain, pg.shared_from_this());
    auto x = torch::arange(3 * kIn).reshape({3, kIn}).to(torch::kFloat).div(10).add(pg.rank());
    model(x).pow(2).mean().backward();
    plain(x).pow(2).mean().backward();
    auto want = plain->fc1->weight.grad();
    auto got = model->fc1->weight.grad();
    EXPECT_TRUE(torch::allclose(got, want, 1e-2, 1e-3));
    EXPECT_FALSE(torch::equal(got, want));  // it did go through bf16
  });
}

TEST(Ddp, BuffersFollowRankZero) {
  run_ranks(2, [](ProcessGroup& pg) {
    torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
    DistributedDataParallel ddp(model, pg.shared_from_this());
    auto x = torch::full({3, 4}, static_cast<float>(pg.rank())) + torch::arange(12).reshape({3, 4});
    model->forward(x).sum().backward();  // running stats differ per rank ...
    auto mean = model->named_buffers()["1.running_mean"].clone();
    auto mean0 = mean.clone();
    pg.broadcast(mean0, 0);
    EXPECT_TRUE(torch::equal(mean, mean0));  // ... until the broadcast after backward
  });
}

// A second backward over a retained graph whose forward saved a buffer (a
// scale factor) runs, as under PyTorch's DDP: the buffer broadcast after the
// first synchronised backward must not count as an in-place change of what
// autograd saved. Both backwards reduce, so the gradient is twice the mean.
TEST(Ddp, ASecondBackwardOverARetainedGraphSurvivesTheBufferBroadcast) {
  // Built before the threads: initialisation draws from the global generator.
  std::vector<torch::nn::Linear> models;
  for (int r = 0; r < 2; ++r) models.emplace_back(4, 2);
  run_ranks(2, [&](ProcessGroup& pg) {
    torch::nn::Linear model = models[static_cast<std::size_t>(pg.rank())];
    model->register_buffer("scale", torch::full({2}, 1.5));
    DistributedDataParallel ddp(model.ptr(), pg.shared_from_this());
    const auto x = torch::full({3, 4}, static_cast<float>(pg.rank() + 1));
    const at::Tensor scale = model->named_buffers()["scale"];
    const at::Tensor loss = (torch::tanh(model->forward(x)) * scale).sum();
    loss.backward({}, /*retain_graph=*/true);
    const at::Tensor once = model->weight.grad().clone();
    ASSERT_NO_THROW(loss.backward());
    EXPECT_TRUE(torch::allclose(model->weight.grad(), 2 * once, 1e-6, 1e-6));
  });
}

}  // namespace
}  // namespace tandem
