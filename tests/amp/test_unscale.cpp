// unscale_and_find_inf(): every result equals g * inv_scale exactly, and an
// inf/NaN anywhere (first, middle, last element, in any tensor) is found.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/thread_ranks.h"
#include "tandem/amp/unscale.h"
#include "tandem/comm/process_group.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
// Odd sizes leave a tail after the vectorised body; the largest is split
// over threads by the default grain.
const std::vector<int64_t> kSizes = {1, 2, 7, 33, 4097, 100'003};
// The poison search runs 27 cases per size; the large size adds nothing the
// threaded test does not cover.
const std::vector<int64_t> kPoisonSizes = {1, 2, 7, 33, 4097};

// Values spread over several orders of magnitude, exact in every dtype's
// storage (generated in the dtype itself).
at::Tensor gradient(int64_t n, at::ScalarType dtype, int64_t seed) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return (at::randn({n}, gen, at::kDouble) * 1000).to(dtype);
}

// The definition: the product in the compute type (float for float32, float16
// and bfloat16; double for float64), inv_scale first rounded to that type,
// then rounded to the storage type.
at::Tensor expected(const at::Tensor& g, double inv_scale) {
  if (g.scalar_type() == at::kDouble) return g.mul(inv_scale);
  const float s = static_cast<float>(inv_scale);
  return g.to(at::kFloat).mul(s).to(g.scalar_type());
}

// Bit-for-bit (as doubles, which hold every value exactly); NaN equals NaN.
void expect_identical(const at::Tensor& actual, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(actual.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual.to(at::kDouble), want.to(at::kDouble), 0.0, 0.0, true)) << what;
}

std::string name(at::ScalarType dtype, int64_t n) {
  return std::string(c10::toString(dtype)) + "[" + std::to_string(n) + "]";
}

TEST(UnscaleTest, CleanGradientsEqualTheProductAndReportNoInf) {
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {
      for (double inv_scale : {1.0 / 3.0, 1.0 / 65536.0}) {
        at::Tensor a = gradient(n, dtype, n);
        at::Tensor b = gradient(n + 1, dtype, n + 7);
        const at::Tensor want_a = expected(a, inv_scale);
        const at::Tensor want_b = expected(b, inv_scale);
        EXPECT_FALSE(unscale_and_find_inf({a, b}, inv_scale)) << name(dtype, n);
        expect_identical(a, want_a, name(dtype, n));
        expect_identical(b, want_b, name(dtype, n));
      }
    }
  }
}

// For float32/float64 the result is exactly ATen's own t.mul_(inv_scale), for
// any inv_scale; for float16/bfloat16 where inv_scale is a power of two.
TEST(UnscaleTest, MatchesAtenMulInPlace) {
  for (auto dtype : kDtypes) {
    const bool reduced = dtype == at::kHalf || dtype == at::kBFloat16;
    const double inv_scale = reduced ? 1.0 / 1024.0 : 1.0 / 3.0;
    at::Tensor g = gradient(10'007, dtype, 3);
    at::Tensor want = g.clone().mul_(inv_scale);
    unscale_and_find_inf({g}, inv_scale);
    expect_identical(g, want, c10::toString(dtype));
  }
}

TEST(UnscaleTest, FindsInfMinusInfAndNanAnywhereInAnyTensor) {
  const double kInf = std::numeric_limits<double>::infinity();
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : kDtypes) {
    for (int64_t n : kPoisonSizes) {
      const std::vector<at::Tensor> clean = {gradient(n, dtype, 1), gradient(n + 3, dtype, 2),
                                             gradient(2 * n, dtype, 3)};
      for (double poison : {kInf, -kInf, kNan}) {
        for (int64_t at_index : {int64_t{0}, n / 2, n - 1}) {
          for (int which = 0; which < 3; ++which) {
            std::vector<at::Tensor> grads;
            for (const auto& g : clean) grads.push_back(g.clone());
            grads[which][at_index] = poison;
            std::vector<at::Tensor> want;
            for (const auto& g : grads) want.push_back(expected(g, 0.25));
            const std::string what = name(dtype, n) + " poison " + std::to_string(poison) +
                                     " at " + std::to_string(at_index) + " of tensor " +
                                     std::to_string(which);
            EXPECT_TRUE(unscale_and_find_inf(grads, 0.25)) << what;
            for (size_t i = 0; i < grads.size(); ++i) expect_identical(grads[i], want[i], what);
          }
        }
      }
    }
  }
}

// A small grain splits one tensor across at::parallel_for tasks; the poison
// sits in the last task only.
TEST(UnscaleTest, MultithreadedSplitFindsInfInTheLastChunk) {
  // The thread count is process-wide: give the tests that follow theirs back.
  struct RestoreThreads {
    int saved = at::get_num_threads();
    ~RestoreThreads() { at::set_num_threads(saved); }
  } restore;
  at::set_num_threads(4);
  UnscaleOptions options;
  options.grain_size = 64;
  for (auto dtype : kDtypes) {
    at::Tensor g = gradient(100'003, dtype, 5);
    g[100'002] = std::numeric_limits<double>::quiet_NaN();
    const at::Tensor want = expected(g, 0.5);
    EXPECT_TRUE(unscale_and_find_inf({g}, 0.5, options)) << c10::toString(dtype);
    expect_identical(g, want, c10::toString(dtype));

    at::Tensor clean = gradient(100'003, dtype, 6);
    EXPECT_FALSE(unscale_and_find_inf({clean}, 0.5, options)) << c10::toString(dtype);
  }
}

TEST(UnscaleTest, EmptyUndefinedAndNoTensorsAreSkipped) {
  EXPECT_FALSE(unscale_and_find_inf({}, 0.5));
  at::Tensor empty = at::empty({0}, at::kFloat);
  at::Tensor undefined;
  at::Tensor g = at::full({3}, 8.0f);
  EXPECT_FALSE(unscale_and_find_inf({empty, undefined, g}, 0.5));
  expect_identical(g, at::full({3}, 4.0f), "after the skipped ones");
}

// inv_scale 1 (a disabled scaler, or a scale of 1): values stay, the check runs.
TEST(UnscaleTest, InvScaleOneOnlyChecks) {
  for (auto dtype : kDtypes) {
    at::Tensor g = gradient(4097, dtype, 9);
    const at::Tensor copy = g.clone();
    EXPECT_FALSE(unscale_and_find_inf({g}, 1.0));
    expect_identical(g, copy, c10::toString(dtype));
    g[17] = std::numeric_limits<double>::infinity();
    EXPECT_TRUE(unscale_and_find_inf({g}, 1.0)) << c10::toString(dtype);
  }
}

// A scale below 1 (inv_scale > 1) can push a finite value past the range;
// the stored result is what the optimizer would consume, so it counts.
TEST(UnscaleTest, OverflowCausedByInvScaleAboveOneIsFound) {
  at::Tensor f = at::full({5}, 3.0e38f);
  EXPECT_TRUE(unscale_and_find_inf({f}, 4.0));
  at::Tensor h = at::full({5}, 60000.0, at::kHalf);
  EXPECT_TRUE(unscale_and_find_inf({h}, 2.0));
  at::Tensor b = at::full({5}, 3.0e38, at::kBFloat16);
  EXPECT_TRUE(unscale_and_find_inf({b}, 4.0));
}

TEST(UnscaleTest, NonContiguousTensorIsUnscaledInPlace) {
  at::Tensor base = gradient(64 * 33, at::kFloat, 11).reshape({64, 33});
  at::Tensor column = base.select(1, 5);  // stride 33
  at::Tensor transposed = base.t();
  ASSERT_FALSE(column.is_contiguous());
  const at::Tensor want = expected(base, 0.125);
  EXPECT_FALSE(unscale_and_find_inf({transposed}, 0.125));
  expect_identical(base, want, "through the transpose");

  const at::Tensor want_column = expected(column, 0.5);
  column[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(unscale_and_find_inf({column}, 0.5));
  EXPECT_TRUE(std::isinf(base[3][5].item<float>()));
  base[3][5] = want_column[3];
  expect_identical(column, want_column, "through the strided column");
  expect_identical(base.select(1, 4), want.select(1, 4), "the neighbouring column untouched");
}

// DDP's case: parameter gradients are views into a flat bucket buffer, and
// the buffer itself is passed.
TEST(UnscaleTest, FlatBucketBufferUnscalesItsViews) {
  at::Tensor bucket = gradient(3 + 12 + 5, at::kFloat, 13);
  at::Tensor w = bucket.narrow(0, 3, 12).view({3, 4});
  const at::Tensor want_w = expected(w.clone(), 1.0 / 256.0);
  w[2][3] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(unscale_and_find_inf({bucket}, 1.0 / 256.0));
  EXPECT_TRUE(std::isinf(w[2][3].item<float>()));
  w[2][3] = want_w[2][3];
  expect_identical(w, want_w, "view into the bucket");
}

TEST(UnscaleTest, UnsupportedTensorThrowsBeforeChangingAny) {
  at::Tensor g = at::full({4}, 2.0f);
  at::Tensor ids = at::ones({4}, at::kLong);
  try {
    unscale_and_find_inf({g, ids}, 0.5);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 1 has dtype Long"), std::string::npos)
        << e.what();
  }
  expect_identical(g, at::full({4}, 2.0f), "untouched");
  UnscaleOptions bad;
  bad.grain_size = 0;
  EXPECT_THROW(unscale_and_find_inf({g}, 0.5, bad), UsageError);
}

// Ranks as threads: the flag is the OR over ranks, the same on every rank.
TEST(UnscaleAgreementTest, AnyRankFoundInfIsTheOrOverRanks) {
  for (int world : {1, 2, 3, 4}) {
    for (int culprit = -1; culprit < world; ++culprit) {
      testing::run_ranks(world, [&](ProcessGroup& pg) {
        const bool local = pg.rank() == culprit;
        const bool agreed = any_rank_found_inf(pg, local);
        TANDEM_CHECK_EQ(agreed, culprit >= 0, "world {} culprit {} rank {}", world, culprit,
                        pg.rank());
      });
    }
  }
}

}  // namespace
}  // namespace tandem
