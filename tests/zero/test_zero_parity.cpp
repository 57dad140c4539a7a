// ZeRO stages 1-3 train exactly like DDP (fp32, within 1e-5 relative), with
// gradient accumulation and clipping, on 1, 2 and 4 ranks, for Adam, AdamW
// and SGD with momentum, with and without optimizer offload.

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <tuple>

#include "support/thread_ranks.h"
#include "support/zero_test_models.h"

namespace tandem {
namespace {

using testing::Opt;
using testing::Params;
using testing::Recipe;
using testing::run_ranks;

const char* name_of(Opt opt) {
  switch (opt) {
    case Opt::kAdam: return "Adam";
    case Opt::kAdamW: return "AdamW";
    case Opt::kSgd: return "Sgd";
    default: return "Other";  // test_zero_optimizers.cpp covers the rest
  }
  return "?";
}

using ParityCase = std::tuple<int /*stage*/, int /*world*/, Opt, bool /*offload*/>;

class ZeroParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ZeroParity, TrainsLikeDdpWithAccumulationAndClipping) {
  auto [stage, world, opt, offload] = GetParam();
  Recipe r;
  r.opt = opt;
  ZeroOptions options;
  options.stage = stage;
  options.reduce_bucket_size = 150;  // several buckets, split across parameters
  options.offload_optimizer = offload;
  const Params expected = testing::ddp_reference(world, r);
  const std::vector<Params> got = testing::zero_runs(world, r, options);
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_LT(testing::max_relative_diff(got[rank], expected), 1e-5) << "rank " << rank;
  }
  // And training moved the parameters at all.
  testing::Stack initial = testing::make_model(r);
  EXPECT_GT(testing::max_relative_diff(testing::snapshot(*initial), expected), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    StagesWorldsOptimizers, ZeroParity,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2, 4),
                       ::testing::Values(Opt::kAdam, Opt::kAdamW, Opt::kSgd),
                       ::testing::Values(false, true)),
    [](const ::testing::TestParamInfo<ParityCase>& info) {
      return "Stage" + std::to_string(std::get<0>(info.param)) + "World" +
             std::to_string(std::get<1>(info.param)) + name_of(std::get<2>(info.param)) +
             (std::get<3>(info.param) ? "Offload" : "");
    });

TEST(ZeroParity, ClippingChangesTheResultSoTheParityAboveCoversIt) {
  Recipe clipped;
  Recipe unclipped;
  unclipped.clip = 0;
  EXPECT_GT(testing::max_relative_diff(testing::ddp_reference(2, clipped),
                                       testing::ddp_reference(2, unclipped)),
            1e-4);
}

TEST(ZeroParity, Stage3WithoutPrefetchAndWithoutLooseParameters) {
  Recipe r;
  r.loose = false;
  r.in = r.width;
  r.out = r.width;
  ZeroOptions options;
  options.stage = 3;
  options.prefetch_bucket_size = 0;
  const Params expected = testing::ddp_reference(2, r);
  for (const auto& got : testing::zero_runs(2, r, options)) {
    EXPECT_LT(testing::max_relative_diff(got, expected), 1e-5);
  }
}

}  // namespace
}  // namespace tandem
