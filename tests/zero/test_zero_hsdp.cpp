// HSDP (ZeroOptimizer with a shard group and a replicate group): W ranks as
// W/P shard groups of P train exactly like one process on the whole batch
// (fp32, within 1e-5 relative), every copy of the model stays equal, only
// gradient shards cross shard groups, and stage 1 is refused.

#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "support/thread_ranks.h"
#include "support/tied_model.h"
#include "support/usage_error.h"
#include "support/zero_test_models.h"
#include "tandem/checkpoint/module_weights.h"
#include "tandem/comm/mesh.h"
#include "tandem/core/parameters.h"
#include "tandem/zero/zero_weights.h"

namespace tandem {
namespace hsdp_test {

using testing::Params;
using testing::Recipe;
using testing::run_ranks;

// One process on the global batch: the reference every layout must match.
Params single_process(const Recipe& r) {
  Params out;
  run_ranks(1, [&](ProcessGroup& pg) { out = testing::train_ddp(pg, r); });
  return out;
}

// The shard and replicate groups of `pg` as W/P rows of P consecutive ranks.
std::pair<std::shared_ptr<ProcessGroup>, std::shared_ptr<ProcessGroup>> hybrid_groups(
    ProcessGroup& pg, int p) {
  ProcessMesh mesh(pg.shared_from_this(), {pg.world_size() / p, p}, {"replica", "shard"});
  return {mesh.group("shard"), mesh.group("replica")};
}

// testing::train_zero's loop, with the optimizer over the mesh's groups.
Params train_hsdp(ProcessGroup& pg, const Recipe& r, ZeroOptions options, int p,
                  ZeroOptimizer::CommStats* stats = nullptr,
                  ZeroMemoryStats* memory = nullptr) {
  auto [shard, replicate] = hybrid_groups(pg, p);
  testing::Stack model = testing::make_model(r);
  auto optimizer = testing::make_optimizer(r.opt, model->parameters());
  ZeroOptimizer zero(model, *optimizer, shard, replicate, options);
  EXPECT_EQ(&zero.process_group(), shard.get());
  EXPECT_EQ(zero.replicate_group(), replicate.get());
  for (int step = 0; step < r.steps; ++step) {
    zero.zero_grad();
    for (int micro = 0; micro < r.accumulation; ++micro) {
      auto [x, y] = testing::micro_batch(r, step, micro, pg.rank(), pg.world_size());
      (torch::nn::functional::cross_entropy(model->forward(x), y) / r.accumulation).backward();
    }
    if (r.clip > 0) zero.clip_grad_norm(r.clip);
    zero.step();
  }
  if (stats != nullptr) *stats = zero.comm_stats();
  if (memory != nullptr) *memory = zero.memory_stats();
  ZeroOptimizer::GatheredParameters whole(zero);
  return testing::snapshot(*model);
}

using Layout = std::pair<int /*world*/, int /*shard size P*/>;
using HsdpCase = std::tuple<Layout, int /*stage*/>;

class HsdpParity : public ::testing::TestWithParam<HsdpCase> {};

TEST_P(HsdpParity, TrainsLikeOneProcessAndEveryReplicaStaysEqual) {
  const auto [layout, stage] = GetParam();
  const auto [world, p] = layout;
  Recipe r;
  r.width = 13;          // odd sizes: shards end inside parameters, with padding
  r.global_batch = 12;   // divides every world here
  ZeroOptions options;
  options.stage = stage;
  options.reduce_bucket_size = 150;  // several stage-2 buckets
  const Params expected = single_process(r);
  Params ddp;  // DDP at the same world: the same sums in the same order
  run_ranks(world, [&](ProcessGroup& pg) {
    Params mine = testing::train_ddp(pg, r);
    if (pg.rank() == 0) ddp = std::move(mine);
  });
  std::vector<Params> got(world);
  run_ranks(world, [&](ProcessGroup& pg) { got[pg.rank()] = train_hsdp(pg, r, options, p); });
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_LT(testing::max_relative_diff(got[rank], ddp), 1e-5) << "rank " << rank;
    // Against one process on the whole batch: 2e-5, since at world 6 the
    // mean of twelve rows is a mean of six 2-row means, and DDP itself sits
    // 1.1e-5 from one process there.
    EXPECT_LT(testing::max_relative_diff(got[rank], expected), 2e-5) << "rank " << rank;
    // The copies of the model in the shard groups are equal bit for bit:
    // the replicate all-reduce hands every counterpart the same shard.
    for (const auto& [name, t] : got[rank]) {
      EXPECT_TRUE(torch::equal(t, got[rank % p].at(name))) << name << " on rank " << rank;
    }
  }
  EXPECT_LT(testing::max_relative_diff(ddp, expected), 2e-5);
  testing::Stack initial = testing::make_model(r);
  EXPECT_GT(testing::max_relative_diff(testing::snapshot(*initial), expected), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndShardSizes, HsdpParity,
    ::testing::Combine(::testing::Values(Layout{4, 2}, Layout{2, 1}, Layout{2, 2}, Layout{3, 1},
                                         Layout{6, 3}, Layout{6, 2}),
                       ::testing::Values(2, 3)),
    [](const ::testing::TestParamInfo<HsdpCase>& info) {
      const Layout& layout = std::get<0>(info.param);
      return "World" + std::to_string(layout.first) + "Shard" + std::to_string(layout.second) +
             "Stage" + std::to_string(std::get<1>(info.param));
    });

TEST(Hsdp, WithoutTheReplicateAllReduceTheGroupsWouldDrift) {
  // The parity above means something: shard groups that each averaged only
  // their own ranks' gradients end up with other parameters.
  Recipe r;
  r.global_batch = 12;
  const Params expected = single_process(r);
  std::vector<Params> apart(4);
  run_ranks(4, [&](ProcessGroup& pg) {
    auto [shard, replicate] = hybrid_groups(pg, 2);
    (void)replicate;
    testing::Stack model = testing::make_model(r);
    auto optimizer = testing::make_optimizer(r.opt, model->parameters());
    ZeroOptions options;
    options.stage = 3;
    ZeroOptimizer zero(model, *optimizer, shard, options);  // no replicate group
    for (int step = 0; step < r.steps; ++step) {
      zero.zero_grad();
      for (int micro = 0; micro < r.accumulation; ++micro) {
        auto [x, y] = testing::micro_batch(r, step, micro, pg.rank(), pg.world_size());
        (torch::nn::functional::cross_entropy(model->forward(x), y) / r.accumulation).backward();
      }
      zero.step();
    }
    ZeroOptimizer::GatheredParameters whole(zero);
    apart[pg.rank()] = testing::snapshot(*model);
  });
  EXPECT_GT(testing::max_relative_diff(apart[0], expected), 1e-4);
}

TEST(Hsdp, OnlyOneAllReduceOfEachGradientShardCrossesTheShardGroups) {
  Recipe r;
  r.width = 13;
  r.global_batch = 12;
  for (int stage : {2, 3}) {
    ZeroOptions options;
    options.stage = stage;
    options.reduce_bucket_size = 150;
    std::vector<ZeroOptimizer::CommStats> stats(4);
    std::vector<ZeroMemoryStats> memory(4);
    run_ranks(4, [&](ProcessGroup& pg) {
      train_hsdp(pg, r, options, 2, &stats[pg.rank()], &memory[pg.rank()]);
    });
    int64_t trainable = 0;
    for (const auto& p : testing::make_model(r)->parameters()) trainable += p.numel();
    int64_t group_bytes = 0;  // one shard group's gradient shards, summed
    for (int rank = 0; rank < 4; ++rank) {
      // Per step: each micro-step all-reduces every fp32 gradient shard this
      // rank holds, once.
      const int64_t shard_bytes = memory[rank].gradient_bytes;
      EXPECT_EQ(stats[rank].last_step_replicate_bytes, r.accumulation * shard_bytes)
          << "stage " << stage << " rank " << rank;
      EXPECT_EQ(stats[rank].replicate_bytes, r.steps * r.accumulation * shard_bytes);
      EXPECT_GT(stats[rank].replicate_all_reduces, 0);
      if (rank < 2) group_bytes += shard_bytes;
    }
    // The shards of one group cover the trainable parameters once, in fp32
    // (plus the padding that makes each group split evenly).
    EXPECT_GE(group_bytes, 4 * trainable);
    EXPECT_LT(group_bytes, 4 * (trainable + 2 * 16));
  }
}

TEST(Hsdp, OneShardGroupIsPlainZeroWithNothingAcrossGroups) {
  Recipe r;
  r.global_batch = 12;
  ZeroOptions options;
  options.stage = 3;
  std::vector<ZeroOptimizer::CommStats> stats(2);
  run_ranks(2, [&](ProcessGroup& pg) { train_hsdp(pg, r, options, 2, &stats[pg.rank()]); });
  for (const auto& s : stats) {
    EXPECT_EQ(s.replicate_bytes, 0);
    EXPECT_EQ(s.replicate_all_reduces, 0);
    EXPECT_GT(s.reduce_scatter_bytes, 0);
    EXPECT_GT(s.gather_bytes, 0);
  }
}

// Tied weights (listed twice by parameters()), a frozen parameter and
// odd sizes (13 x 10 splits inside tensors), against plain LibTorch on one
// process.
Params train_tied(ProcessGroup* pg, int p, int stage) {
  testing::TiedLmOptions o;
  o.head_in_unit = stage == 3;  // the tie crosses a unit boundary
  testing::TiedLm model = testing::make_tied_lm(o);
  model->blocks[1]->fc->bias.requires_grad_(false);
  std::vector<torch::Tensor> trainable;
  for (const auto& t : unique_parameters(*model)) {
    if (t.requires_grad()) trainable.push_back(t);
  }
  torch::optim::Adam adam(trainable, torch::optim::AdamOptions(1e-2));
  std::unique_ptr<ZeroOptimizer> zero;
  const int world = pg == nullptr ? 1 : pg->world_size();
  const int rank = pg == nullptr ? 0 : pg->rank();
  if (pg != nullptr) {
    auto [shard, replicate] = hybrid_groups(*pg, p);
    ZeroOptions options;
    options.stage = stage;
    options.reduce_bucket_size = 40;
    zero = std::make_unique<ZeroOptimizer>(model, adam, shard, replicate, options);
  }
  const int global = 12;
  for (int step = 0; step < 3; ++step) {
    if (zero) zero->zero_grad(); else adam.zero_grad();
    auto [ids, targets] = testing::tied_lm_batch(o, step, global);
    const int per = global / world;
    auto logits = model->forward(ids.narrow(0, rank * per, per));
    torch::nn::functional::cross_entropy(logits, targets.view({global, -1})
                                                      .narrow(0, rank * per, per)
                                                      .reshape({-1}))
        .backward();
    if (zero) zero->step(); else adam.step();
  }
  std::optional<ZeroOptimizer::GatheredParameters> whole;
  if (zero) whole.emplace(*zero);
  return testing::snapshot(*model);
}

TEST(Hsdp, TiedAndFrozenParametersWithOddSizesTrainLikeOneProcess) {
  for (int stage : {2, 3}) {
    const Params expected = train_tied(nullptr, 0, stage);
    for (auto [world, p] : {std::pair{4, 2}, std::pair{6, 3}, std::pair{3, 1}}) {
      std::vector<Params> got(world);
      run_ranks(world, [&](ProcessGroup& pg) { got[pg.rank()] = train_tied(&pg, p, stage); });
      for (int rank = 0; rank < world; ++rank) {
        EXPECT_LT(testing::max_relative_diff(got[rank], expected), 1e-5)
            << "stage " << stage << " world " << world << " P " << p << " rank " << rank;
        // The tie holds, and the frozen bias never moved.
        EXPECT_TRUE(torch::equal(got[rank].at("emb.weight"),
                                 got[rank].at(stage == 3 ? "head.weight" : "head_weight")));
        EXPECT_TRUE(torch::equal(got[rank].at("block1.fc.bias"),
                                 testing::snapshot(*testing::make_tied_lm()).at("block1.fc.bias")));
      }
    }
  }
}

TEST(Hsdp, PretrainedWeightsMissingInOneShardGroupFailEveryRank) {
  // The weights file exists for the first shard group only (another host's
  // disk, say): every rank of both groups must throw, none go on alone.
  Recipe r;
  const std::string good = ::testing::TempDir() + "/hsdp_weights.safetensors";
  save_safetensors(*testing::make_model(r), good);
  std::vector<std::string> errors(4);
  run_ranks(4, [&](ProcessGroup& pg) {
    auto [shard, replicate] = hybrid_groups(pg, 2);
    testing::Stack model = testing::make_model(r);
    auto optimizer = testing::make_optimizer(r.opt, model->parameters());
    ZeroOptions options;
    options.stage = 3;
    ZeroOptimizer zero(model, *optimizer, shard, replicate, options);
    const std::string path = pg.rank() < 2 ? good : good + ".not-on-this-host";
    try {
      load_safetensors_into_shards(zero, path);
    } catch (const std::exception& e) {
      errors[pg.rank()] = e.what();
    }
  });
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(errors[rank].find("not-on-this-host"), std::string::npos)
        << "rank " << rank << ": " << errors[rank];
  }
  EXPECT_NE(errors[0].find("[shard group 1/2]"), std::string::npos) << errors[0];
}

TEST(Hsdp, Stage1WithReplicasIsRefused) {
  run_ranks(4, [&](ProcessGroup& pg) {
    auto [shard, replicate] = hybrid_groups(pg, 2);
    Recipe r;
    testing::Stack model = testing::make_model(r);
    auto optimizer = testing::make_optimizer(r.opt, model->parameters());
    ZeroOptions options;
    options.stage = 1;
    const std::string message = testing::usage_error_message(
        [&] { ZeroOptimizer zero(model, *optimizer, shard, replicate, options); });
    EXPECT_NE(message.find("needs stage 2 or 3, got stage 1"), std::string::npos) << message;
  });
}

}  // namespace hsdp_test
}  // namespace tandem
