// DDP with tied weights: the output layer registers the embedding matrix a
// second time. The shared tensor must get one gradient slot and be averaged
// once, whatever the bucket layout, so training equals the single-process run
// on the concatenated batch. Each case repeats to catch a race between two
// hooks adopting the same gradient.

#include <gtest/gtest.h>

#include <algorithm>

#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "support/tied_model.h"
#include "tandem/core/parameters.h"
#include "tandem/parallel/ddp.h"

namespace tandem {
namespace ddp_tied_weights {

using testing::TiedLm;
using testing::TiedLmOptions;

constexpr int kSteps = 5, kPerRank = 3, kRepeats = 4;

enum class OptimizerList { kLibTorch, kUnique };

std::vector<torch::Tensor> optimizer_params(TiedLm& model, OptimizerList list) {
  return list == OptimizerList::kLibTorch ? model->parameters() : unique_parameters(*model);
}

std::map<std::string, torch::Tensor> train_single(int global_batch, OptimizerList list) {
  TiedLmOptions o;
  TiedLm model = testing::make_tied_lm(o);
  torch::optim::Adam opt(optimizer_params(model, list), torch::optim::AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = testing::tied_lm_batch(o, s, global_batch);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model(x), y).backward();
    opt.step();
  }
  return testing::snapshot(*model);
}

class TiedDdp : public ::testing::TestWithParam<std::tuple<int, double, OptimizerList>> {};

TEST_P(TiedDdp, TrainsLikeSingleProcessOnTheConcatenatedBatch) {
  const auto [world, bucket_mb, list] = GetParam();
  const auto expected = train_single(world * kPerRank, list);
  DDPOptions options;
  options.bucket_cap_mb = bucket_mb;
  options.first_bucket_cap_mb = bucket_mb;
  options.cache_cpu_allocations = false;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    std::vector<std::map<std::string, torch::Tensor>> trained(world);
    testing::run_ranks(world, [&, list = list](ProcessGroup& pg) {
      TiedLmOptions o;
      TiedLm model = testing::make_tied_lm(o);
      DistributedDataParallel ddp(model, pg.shared_from_this(), options);
      torch::optim::Adam opt(optimizer_params(model, list), torch::optim::AdamOptions(1e-2));
      for (int s = 0; s < kSteps; ++s) {
        auto [x, y] = testing::tied_lm_batch(o, s, pg.world_size() * kPerRank);
        x = x.narrow(0, pg.rank() * kPerRank, kPerRank);
        y = y.narrow(0, pg.rank() * kPerRank * x.size(1), kPerRank * x.size(1));
        opt.zero_grad();
        torch::nn::functional::cross_entropy(model(x), y).backward();
        opt.step();
      }
      ASSERT_TRUE(model->head_weight.is_same(model->emb->weight)) << "the tie must survive DDP";
      trained[pg.rank()] = testing::snapshot(*model);
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_LT(testing::max_relative_diff(trained[r], expected), 1e-5)
          << "rank " << r << ", repeat " << repeat;
      for (const auto& [name, t] : trained[0]) {
        EXPECT_TRUE(torch::equal(trained[r].at(name), t)) << name << " differs on rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, TiedDdp,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(25.0, 1e-5),
                       ::testing::Values(OptimizerList::kLibTorch, OptimizerList::kUnique)),
    [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) < 1 ? "_tiny_buckets" : "_default_buckets") +
             (std::get<2>(info.param) == OptimizerList::kLibTorch ? "_libtorch_list"
                                                                  : "_unique_list");
    });

TEST(TiedDdpBuckets, TheSharedTensorHasOneSlotUnderItsFirstName) {
  testing::run_ranks(2, [](ProcessGroup& pg) {
    TiedLm model = testing::make_tied_lm();
    DDPOptions options;
    options.bucket_cap_mb = 1e-6;  // one parameter per bucket
    options.first_bucket_cap_mb = 1e-6;
    options.cache_cpu_allocations = false;
    DistributedDataParallel ddp(model, pg.shared_from_this(), options);
    std::vector<std::string> slots;
    for (const auto& bucket : ddp.bucket_parameter_names()) {
      slots.insert(slots.end(), bucket.begin(), bucket.end());
    }
    // LibTorch lists a module's own parameters before its children's, so the
    // tie's first name is the root's head_weight (as in Python).
    EXPECT_EQ(std::count(slots.begin(), slots.end(), "head_weight"), 1);
    EXPECT_EQ(std::count(slots.begin(), slots.end(), "emb.weight"), 0);
    EXPECT_EQ(slots.size(), unique_parameters(*model).size());
    EXPECT_EQ(slots.size() + 1, model->parameters().size());
  });
}

TEST(UniqueParameters, ListsATiedTensorOnceWithItsOtherNames) {
  TiedLm model = testing::make_tied_lm();
  const auto unique = unique_named_parameters(*model);
  ASSERT_EQ(unique.size() + 1, model->named_parameters().size());
  std::size_t tied = 0;
  for (const auto& p : unique) {
    if (p.aliases.empty()) continue;
    ++tied;
    EXPECT_EQ(p.name, "head_weight");
    EXPECT_EQ(p.aliases, std::vector<std::string>{"emb.weight"});
    EXPECT_TRUE(p.tensor.is_same(model->emb->weight));
  }
  EXPECT_EQ(tied, 1u);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(unique_optimizer_parameters(sgd).size(), unique.size());
}

}  // namespace ddp_tied_weights
}  // namespace tandem
