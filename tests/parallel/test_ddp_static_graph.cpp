// DDPOptions::static_graph at 2 and 3 ranks: a parameter unused in every
// iteration needs no find_unused_parameters and keeps no gradient, as in one
// process; the per-step unused-parameter search stops after the first
// backward; a block checkpointed twice (its parameters' hooks fire twice per
// backward) trains like one process; and a graph that changes is refused
// with the parameters named.

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/parity.h"
#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/parallel/activation_checkpoint.h"
#include "tandem/parallel/ddp.h"

namespace tandem {
namespace {

using testing::max_relative_diff;
using testing::Params;
using testing::run_ranks;
using testing::snapshot;
using testing::usage_error_message;

struct MaybeSpareImpl : torch::nn::Module {
  MaybeSpareImpl() {
    used = register_module("used", torch::nn::Linear(4, 4));
    spare = register_module("spare", torch::nn::Linear(4, 4));
    head = register_module("head", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x, bool use_spare) {
    x = torch::tanh(used(x));
    if (use_spare) x = torch::tanh(spare(x));
    return head(x);
  }
  torch::nn::Linear used{nullptr}, spare{nullptr}, head{nullptr};
};
TORCH_MODULE(MaybeSpare);

// `shared` runs twice per forward; with `checkpointed`, each run is its own
// tandem::checkpoint, whose nested backward fires shared's gradient hooks
// once more.
struct SharedTwiceImpl : torch::nn::Module {
  SharedTwiceImpl() {
    input = register_module("input", torch::nn::Linear(6, 8));
    shared = register_module("shared", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::tanh(input(x));
    auto block = [this](const torch::Tensor& h) { return torch::tanh(shared(h)); };
    for (int k = 0; k < 2; ++k) x = checkpointed ? tandem::checkpoint(block, x) : block(x);
    return head(x);
  }
  bool checkpointed = false;
  torch::nn::Linear input{nullptr}, shared{nullptr}, head{nullptr};
};
TORCH_MODULE(SharedTwice);

constexpr int kStaticSteps = 4, kStaticPerRank = 3;

// Replicas of one initial model (before the rank threads, which share
// torch's global generator).
template <typename Holder>
std::vector<Holder> static_replicas(int count) {
  std::vector<Holder> out;
  for (int r = 0; r < count; ++r) {
    torch::manual_seed(5);
    out.push_back(Holder());
  }
  return out;
}

torch::Tensor static_batch(int step, int rows, int width) {
  return torch::randn({rows, width}, at::detail::createCPUGenerator(31 + step));
}

class DdpStaticGraph : public ::testing::TestWithParam<int> {};

TEST_P(DdpStaticGraph, UnusedParameterNeedsNoSearchAndTrainsLikeOneProcess) {
  const int world = GetParam();
  std::vector<MaybeSpare> models = static_replicas<MaybeSpare>(world + 1);
  MaybeSpare single = models.back();
  torch::optim::SGD sgd(single->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kStaticSteps; ++step) {
    sgd.zero_grad();
    single(static_batch(step, kStaticPerRank * world, 4), false).pow(2).mean().backward();
    sgd.step();
  }
  const Params want = snapshot(*single);
  run_ranks(world, [&](ProcessGroup& pg) {
    MaybeSpare model = models[pg.rank()];
    DDPOptions options;
    options.static_graph = true;  // and no find_unused_parameters
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kStaticSteps; ++step) {
      opt.zero_grad();
      auto x = static_batch(step, kStaticPerRank * world, 4)
                   .narrow(0, pg.rank() * kStaticPerRank, kStaticPerRank);
      model(x, false).pow(2).mean().backward();
      EXPECT_FALSE(model->spare->weight.grad().defined()) << "step " << step;
      opt.step();
    }
    EXPECT_EQ(ddp.sync_count(), kStaticSteps);
    EXPECT_LT(max_relative_diff(snapshot(*model), want), 1e-5) << "rank " << pg.rank();
  });
}

// Collectives per backward, counted by the process group: the bucket
// (one), plus the used-parameter all-reduce when searching. Once the first
// static backward has recorded who uses what, no search is needed.
TEST_P(DdpStaticGraph, SkipsTheUnusedParameterSearchAfterTheFirstBackward) {
  const int world = GetParam();
  std::vector<MaybeSpare> models = static_replicas<MaybeSpare>(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    MaybeSpare model = models[pg.rank()];
    auto collectives_per_backward = [&](bool static_graph) {
      DDPOptions options;
      options.find_unused_parameters = true;
      options.static_graph = static_graph;
      DistributedDataParallel ddp(model, pg.shared_from_this(), options);
      std::vector<std::uint64_t> counts;
      for (int step = 0; step < 3; ++step) {
        const std::uint64_t before = pg.sequence_number();
        model(torch::ones({2, 4}), false).sum().backward();
        counts.push_back(pg.sequence_number() - before);
      }
      return counts;
    };
    // First backward: bucket, search, bucket-order broadcast (the rebuild).
    EXPECT_EQ(collectives_per_backward(false), std::vector<std::uint64_t>({3, 2, 2}));
    EXPECT_EQ(collectives_per_backward(true), std::vector<std::uint64_t>({3, 1, 1}));
  });
}

// A parameter only rank 0 uses, in every iteration: static_graph without
// find_unused_parameters gives the gradients find_unused_parameters gives.
TEST_P(DdpStaticGraph, ParameterUsedOnOneRankOnlyGetsWhatTheSearchGives) {
  const int world = GetParam();
  std::vector<MaybeSpare> models = static_replicas<MaybeSpare>(2 * world);
  run_ranks(world, [&](ProcessGroup& pg) {
    MaybeSpare fixed = models[pg.rank()], searched = models[world + pg.rank()];
    DDPOptions static_options;
    static_options.static_graph = true;
    DDPOptions search_options;
    search_options.find_unused_parameters = true;
    DistributedDataParallel ddp_fixed(fixed, pg.shared_from_this(), static_options);
    DistributedDataParallel ddp_searched(searched, pg.shared_from_this(), search_options);
    for (int step = 0; step < 3; ++step) {
      auto x = static_batch(step, 2, 4).add(pg.rank());
      for (MaybeSpare* m : {&fixed, &searched}) {
        for (auto& p : (*m)->parameters()) p.mutable_grad() = torch::Tensor();
        (*m)->forward(x, pg.rank() == 0).pow(2).mean().backward();
      }
      for (auto& item : searched->named_parameters()) {
        const auto got = fixed->named_parameters()[item.key()].grad();
        ASSERT_TRUE(got.defined()) << item.key() << " step " << step;
        EXPECT_TRUE(torch::equal(got, item.value().grad())) << item.key() << " step " << step;
      }
    }
  });
}

TEST_P(DdpStaticGraph, BlockCheckpointedTwiceTrainsLikeOneProcess) {
  const int world = GetParam();
  std::vector<SharedTwice> models = static_replicas<SharedTwice>(world + 1);
  SharedTwice single = models.back();
  torch::optim::SGD sgd(single->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kStaticSteps; ++step) {
    sgd.zero_grad();
    single(static_batch(step, kStaticPerRank * world, 6)).pow(2).mean().backward();
    sgd.step();
  }
  const Params want = snapshot(*single);
  run_ranks(world, [&](ProcessGroup& pg) {
    SharedTwice model = models[pg.rank()];
    model->checkpointed = true;
    DDPOptions options;
    options.static_graph = true;
    options.bucket_cap_mb = 1e-6;  // `shared` in buckets of its own, launched mid-backward
    options.first_bucket_cap_mb = 1e-6;
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < kStaticSteps; ++step) {
      opt.zero_grad();
      auto x = static_batch(step, kStaticPerRank * world, 6)
                   .narrow(0, pg.rank() * kStaticPerRank, kStaticPerRank);
      model(x).pow(2).mean().backward();
      opt.step();
    }
    EXPECT_LT(max_relative_diff(snapshot(*model), want), 1e-5) << "rank " << pg.rank();
  });
}

// Without static_graph the second firing of `shared`'s hooks comes after
// its bucket may have gone out: an error that says so and names the fix.
TEST_P(DdpStaticGraph, WithoutItABlockCheckpointedTwiceIsAnErrorNamingTheFix) {
  const int world = GetParam();
  std::vector<SharedTwice> models = static_replicas<SharedTwice>(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    SharedTwice model = models[pg.rank()];
    model->checkpointed = true;
    DistributedDataParallel ddp(model, pg.shared_from_this());
    const std::string message =
        usage_error_message([&] { model(torch::ones({2, 6})).sum().backward(); });
    EXPECT_NE(message.find("shared.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("more than once in one backward"), std::string::npos) << message;
    EXPECT_NE(message.find("static_graph = true"), std::string::npos) << message;
  });
}

TEST_P(DdpStaticGraph, RefusesAParameterThatStartsOrStopsGettingGradients) {
  const int world = GetParam();
  std::vector<MaybeSpare> models = static_replicas<MaybeSpare>(world);
  run_ranks(world, [&](ProcessGroup& pg) {
    MaybeSpare model = models[pg.rank()];
    DDPOptions options;
    options.static_graph = true;
    for (bool first_uses_spare : {false, true}) {
      DistributedDataParallel ddp(model, pg.shared_from_this(), options);
      model(torch::ones({2, 4}), first_uses_spare).sum().backward();
      model(torch::ones({2, 4}), first_uses_spare).sum().backward();  // the same: fine
      const std::string message = usage_error_message(
          [&] { model(torch::ones({2, 4}), !first_uses_spare).sum().backward(); });
      EXPECT_NE(message.find("static_graph is set, but this backward (synchronised backward #3) "
                             "differs from the first"),
                std::string::npos)
          << message;
      const std::string change = first_uses_spare
                                     ? "spare.weight (0 gradient(s), 1 in the first backward)"
                                     : "spare.weight (1 gradient(s), 0 in the first backward)";
      EXPECT_NE(message.find(change), std::string::npos) << message;
      EXPECT_NE(message.find("static_graph = false"), std::string::npos) << message;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, DdpStaticGraph, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "World" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem
