// Accelerator::profile: one Chrome trace per rank, in the trace event
// format's schema, holding that rank's training step with tandem's
// collectives and DDP's buckets named.

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "support/accelerator_testing.h"
#include "support/ddp_test_models.h"
#include "support/scratch_dir.h"
#include "support/thread_ranks.h"
#include "tandem/accelerate/accelerator.h"
#include "tandem/core/error.h"

namespace tandem {
namespace profile_test {

using testing::kHidden;
using testing::kIn;
using testing::kOut;
using testing::make_dataset;
using testing::Mlp;
using testing::run_ranks;
using testing::ScratchDir;

class Profile : public ::testing::TestWithParam<int> {};

TEST_P(Profile, WritesOneChromeTracePerRankWithTandemAnnotations) {
  const int world = GetParam();
  const auto data = make_dataset(world * 4);
  ScratchDir dir;
  run_ranks(world, [&](ProcessGroup& pg) {
    AcceleratorOptions options;
    DDPOptions ddp;
    ddp.first_bucket_cap_mb = ddp.bucket_cap_mb = 0.0005;  // several buckets
    options.ddp = ddp;
    Accelerator accelerator(pg.shared_from_this(), Config{}, options);
    Mlp model(kIn, kHidden, kOut);
    auto sgd =
        std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    auto [optimizer, loader] = accelerator.prepare(model, sgd, {data.x, data.y}, int64_t{4});
    ProfileOptions profile_options;
    profile_options.output_trace_dir = dir / "traces";
    auto session = accelerator.profile(profile_options);
    for (auto& batch : *loader) {
      optimizer->zero_grad();
      accelerator.backward(torch::mse_loss(model->forward(batch[0]), batch[1]));
      optimizer->step();
    }
    accelerator.reduce(torch::ones({2}));
    session.stop();
    EXPECT_EQ(session.trace_path(),
              dir / ("traces/profile_" + std::to_string(pg.rank()) + ".json"));
  });

  std::set<std::string> seen_tids;
  for (int r = 0; r < world; ++r) {
    const std::string path = dir / ("traces/profile_" + std::to_string(r) + ".json");
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    const nlohmann::json trace = nlohmann::json::parse(in);
    ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array()) << path;
    std::set<std::string> names;
    std::set<std::string> annotated_tids;
    for (const auto& e : trace["traceEvents"]) {
      for (const char* key : {"ph", "name", "pid", "tid", "ts"}) {
        ASSERT_TRUE(e.contains(key)) << path << ": an event without '" << key << "': " << e.dump();
      }
      ASSERT_TRUE(e["ph"].is_string() && e["name"].is_string()) << e.dump();
      if (e["ph"] == "X") {
        ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
        EXPECT_GE(e["dur"].get<double>(), 0.0);
      }
      const std::string name = e["name"].get<std::string>();
      names.insert(name);
      if (name.rfind("tandem::", 0) == 0) annotated_tids.insert(e["tid"].dump());
    }
    EXPECT_TRUE(names.count("tandem::all_reduce")) << path;
    EXPECT_TRUE(names.count("tandem::bucket 0")) << path;
    EXPECT_TRUE(names.count("tandem::bucket 1")) << path;
    EXPECT_TRUE(names.count("aten::mm") || names.count("aten::addmm")) << path;
    // This rank's events only: its collectives ran on one thread, which no
    // other rank's file shows.
    EXPECT_EQ(annotated_tids.size(), 1u) << path;
    for (const auto& tid : annotated_tids) EXPECT_TRUE(seen_tids.insert(tid).second) << path;
  }
}

INSTANTIATE_TEST_SUITE_P(TwoAndThree, Profile, ::testing::Values(2, 3));

// One rank in the process (as under tandem launch): the trace is saved
// straight to the rank's file, nothing split.
TEST(ProfileAlone, OneRankPerProcessSavesItsTraceDirectly) {
  ScratchDir dir;
  run_ranks(1, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    ProfileOptions options;
    options.output_trace_dir = dir.path();
    auto session = accelerator.profile(options);
    accelerator.reduce(torch::ones({3}));
    session.stop();
    session.stop();  // once: nothing more
  });
  std::ifstream in(dir / "profile_0.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json trace = nlohmann::json::parse(in);
  bool annotated = false;
  for (const auto& e : trace.at("traceEvents")) {
    annotated = annotated || e.value("name", "") == "tandem::all_reduce";
  }
  EXPECT_TRUE(annotated);
  EXPECT_FALSE(fs::exists(dir / "profile_0.json.process"));
}

TEST(ProfileErrors, RefusesAnEmptyOutputDirectory) {
  run_ranks(2, [&](ProcessGroup& pg) {
    Accelerator accelerator(pg.shared_from_this(), Config{});
    EXPECT_THROW((void)accelerator.profile(ProfileOptions{}), UsageError);
  });
}

}  // namespace profile_test
}  // namespace tandem
