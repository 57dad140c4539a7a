// tandem::PowerSGDHook against PyTorch's powerSGD_hook: the same fixed
// gradients on 2 and 3 ranks (threads) must give the same reduced buckets and
// the same error feedback on every rank, iteration after iteration (random
// Q, warm start, error feedback, QR and Gram-Schmidt). The vectors come
// from tests/data/vectors/record_powersgd_vectors.py, which runs PyTorch's
// hook itself over Gloo on the same gradients (its docstring says how).

#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "support/thread_ranks.h"
#include "support/usage_error.h"
#include "tandem/parallel/powersgd_hook.h"

namespace tandem {
namespace {

using testing::run_ranks;
using testing::usage_error_message;

const nlohmann::json& powersgd_vectors() {
  static const nlohmann::json vectors = [] {
    const std::string path = std::string(TANDEM_TEST_DATA_DIR) + "/powersgd.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    return nlohmann::json::parse(in);
  }();
  return vectors;
}

std::vector<std::vector<int64_t>> bucket_shapes(std::size_t bucket) {
  return powersgd_vectors().at("buckets").at(bucket).get<std::vector<std::vector<int64_t>>>();
}

int64_t bucket_numel(std::size_t bucket) {
  int64_t total = 0;
  for (const auto& shape : bucket_shapes(bucket)) total += at::empty(shape).numel();
  return total;
}

// The recorder's gradient of `rank` for `iteration` and `bucket`.
at::Tensor recorded_gradient(int rank, int iteration, std::size_t bucket) {
  const uint64_t seed = 1000 * iteration + 10 * rank + bucket;
  return at::randn({bucket_numel(bucket)}, at::detail::createCPUGenerator(seed));
}

at::Tensor as_tensor(const nlohmann::json& values) {
  return torch::tensor(values.get<std::vector<float>>());
}

// Float32 arithmetic in another order than PyTorch's (norms, the sums at 3
// ranks), carried through three warm-started iterations: the largest
// difference observed is 8.5e-7 on values of order 1.
constexpr double kVectorTolerance = 1e-5;

class PowerSGDVectors : public ::testing::TestWithParam<int> {};

TEST_P(PowerSGDVectors, ReducedBucketsAndErrorFeedbackMatchPyTorch) {
  const nlohmann::json& doc = powersgd_vectors();
  const nlohmann::json& c = doc.at("cases").at(GetParam());
  const int world = c.at("world");
  PowerSGDOptions options;
  options.matrix_approximation_rank = c.at("matrix_approximation_rank");
  options.min_compression_rate = c.at("min_compression_rate");
  options.use_error_feedback = c.at("use_error_feedback");
  options.warm_start = c.at("warm_start");
  options.start_powerSGD_iter = doc.at("start_powerSGD_iter");
  options.random_seed = doc.at("random_seed");
  const int iterations = doc.at("iterations");
  const std::size_t buckets = doc.at("buckets").size();
  run_ranks(world, [&](ProcessGroup& pg) {
    PowerSGDHook hook(options);
    std::size_t step = 0;
    for (int it = 0; it < iterations; ++it) {
      std::vector<GradBucket> views;
      for (std::size_t b = 0; b < buckets; ++b) {
        std::vector<at::Tensor> params;
        for (const auto& shape : bucket_shapes(b)) params.push_back(at::empty(shape));
        views.emplace_back(b, buckets, recorded_gradient(pg.rank(), it, b), params,
                           std::vector<std::string>{}, pg);
      }
      // As DDP runs them: every bucket started, then each finished.
      std::vector<HookWork> works;
      for (auto& view : views) works.push_back(hook.start(view));
      for (auto& work : works) work.wait();
      for (std::size_t b = 0; b < buckets; ++b) {
        SCOPED_TRACE("rank " + std::to_string(pg.rank()) + " iteration " + std::to_string(it) +
                     " bucket " + std::to_string(b));
        const at::Tensor& got = views[b].buffer();
        if (it < options.start_powerSGD_iter) {
          at::Tensor mean = at::zeros_like(got);
          for (int r = 0; r < world; ++r) mean += recorded_gradient(r, it, b);
          EXPECT_TRUE(torch::allclose(got, mean / world, 1e-6, 1e-6));
          continue;
        }
        const nlohmann::json& want = c.at("steps").at(step++);
        ASSERT_EQ(want.at("iteration"), it);
        ASSERT_EQ(want.at("bucket"), b);
        EXPECT_TRUE(torch::allclose(got, as_tensor(want.at("reduced")), kVectorTolerance,
                                    kVectorTolerance))
            << (got - as_tensor(want.at("reduced"))).abs().max().item<double>();
        if (options.use_error_feedback) {
          const at::Tensor error = as_tensor(want.at("error").at(pg.rank()));
          EXPECT_TRUE(torch::allclose(hook.error(b), error, kVectorTolerance, kVectorTolerance))
              << (hook.error(b) - error).abs().max().item<double>();
        } else {
          EXPECT_FALSE(hook.error(b).defined());
        }
      }
    }
    EXPECT_EQ(hook.iteration(), iterations);
    EXPECT_GT(hook.numel_before_compression(), hook.numel_after_compression());
  });
}

INSTANTIATE_TEST_SUITE_P(Recorded, PowerSGDVectors, ::testing::Range(0, 6),
                         [](const ::testing::TestParamInfo<int>& info) {
                           const auto& c = powersgd_vectors().at("cases").at(info.param);
                           return c.at("name").get<std::string>() + "_world" +
                                  std::to_string(c.at("world").get<int>());
                         });

TEST(PowerSGDVectorsFile, HoldsBothWorldsOfEveryCase) {
  const auto& cases = powersgd_vectors().at("cases");
  ASSERT_EQ(cases.size(), 6u);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    EXPECT_EQ(cases[k].at("world"), k % 2 == 0 ? 2 : 3) << k;
    EXPECT_FALSE(cases[k].at("steps").empty()) << k;
  }
}

// The gradients this test draws are the recorder's (PyTorch's generator
// and LibTorch's are one).
TEST(PowerSGDVectorsFile, RecordedGradientsAreTheOnesThisTestDraws) {
  const at::Tensor want = as_tensor(powersgd_vectors().at("sample_gradient"));
  EXPECT_TRUE(torch::allclose(recorded_gradient(2, 3, 1), want, 1e-6, 1e-7));
}

TEST(PowerSGDHookOptions, RefuseWhatPyTorchRefusesWithTheFix) {
  PowerSGDOptions early;
  early.start_powerSGD_iter = 1;
  std::string message = usage_error_message([&] { PowerSGDHook hook(early); });
  EXPECT_NE(message.find("start_powerSGD_iter is 1"), std::string::npos) << message;
  EXPECT_NE(message.find("at least 2"), std::string::npos) << message;
  early.use_error_feedback = false;
  early.warm_start = false;
  EXPECT_EQ(usage_error_message([&] { PowerSGDHook hook(early); }), "");

  PowerSGDOptions rank0;
  rank0.matrix_approximation_rank = 0;
  message = usage_error_message([&] { PowerSGDHook hook(rank0); });
  EXPECT_NE(message.find("matrix_approximation_rank must be at least 1, got 0"),
            std::string::npos)
      << message;
}

// A matrix that does not compress by min_compression_rate, and every bias,
// is averaged exactly; a zero gradient compresses to zeros, not NaN.
TEST(PowerSGDHook, AveragesWhatDoesNotCompressAndKeepsZeroGradientsFinite) {
  for (int world : {2, 3}) {
    run_ranks(world, [&](ProcessGroup& pg) {
      PowerSGDOptions options;
      options.start_powerSGD_iter = 2;
      PowerSGDHook hook(options);
      std::vector<at::Tensor> params{at::empty({4, 4}), at::empty({6}), at::empty({32, 16})};
      for (int it = 0; it < 3; ++it) {
        at::Tensor buffer = at::zeros({16 + 6 + 512});
        buffer.narrow(0, 0, 22).copy_(at::arange(22).to(at::kFloat) * (pg.rank() + 1));
        GradBucket bucket(0, 1, buffer, params, {}, pg);
        hook.start(bucket).wait();
        const double mean_factor = (world + 1) / 2.0;  // average of 1..world
        EXPECT_TRUE(torch::allclose(buffer.narrow(0, 0, 22),
                                    at::arange(22).to(at::kFloat) * mean_factor, 1e-6, 1e-6))
            << "world " << world << " iteration " << it;
        EXPECT_TRUE(torch::equal(buffer.narrow(0, 22, 512), at::zeros({512})));
      }
      // 4x4 at rank 1: (4 + 4) * 2 = 16 is not below 16; the bias never.
      EXPECT_EQ(hook.numel_before_compression(), 16 + 6 + 512);
      EXPECT_EQ(hook.numel_after_compression(), 16 + 6 + (32 + 16));
    });
  }
}

}  // namespace
}  // namespace tandem
