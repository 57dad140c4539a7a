// Loss scalers as specifications: scripted overflow patterns against scale
// sequences worked out from the documented rules (torch's
// _amp_update_scale_, DeepSpeed 0.19.8's DynamicLossScaler.update_scale),
// and against DeepSpeed's own class on random sequences.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "tandem/amp/loss_scaler.h"

namespace tandem {
namespace {

constexpr bool I = true;   // the step overflowed
constexpr bool C = false;  // a clean step

struct Trace {
  std::vector<double> scales;       // scale() after each update
  std::set<int64_t> skipped;        // 1-based steps whose update() returned true
};

Trace run(LossScaler& scaler, const std::vector<bool>& pattern) {
  Trace trace;
  for (bool found_inf : pattern) {
    if (scaler.update(found_inf)) trace.skipped.insert(scaler.steps());
    trace.scales.push_back(scaler.scale());
  }
  return trace;
}

GradScalerOptions torch_options(double init, double growth, double backoff, int64_t interval) {
  GradScalerOptions o;
  o.init_scale = init;
  o.growth_factor = growth;
  o.backoff_factor = backoff;
  o.growth_interval = interval;
  return o;
}

LossScaleConfig deepspeed_config(int power, int64_t window, int hysteresis,
                                 bool consecutive = false, double min_scale = 1) {
  LossScaleConfig c;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  c.deepspeed_semantics = true;
  return c;
}

// ---- DeepSpeed's DynamicLossScaler itself, on random sequences -----------

// 200 random overflow sequences (lengths 20-120, overflow rates 2-70%, the
// windows, hysteresis, consecutive_hysteresis and floors users write) give
// the scales the installed DeepSpeed's DynamicLossScaler gives, step for
// step (tests/amp/deepspeed_scaler_reference.py). Label `ci`: it starts
// the peer Python and imports DeepSpeed.
TEST(DeepSpeedScalerInterop, RandomSequencesScaleAsDeepSpeedsDynamicLossScaler) {
  const std::string python = TANDEM_PEER_PYTHON;
  if (python.empty() || testing::run_process({python, "-c", "import deepspeed"}, 120).exit_code)
    GTEST_SKIP() << "no deepspeed in the peer Python";
  struct Case {
    int power;
    int64_t window;
    int hysteresis;
    bool consecutive;
    double min_scale;
    std::string sequence;
  };
  std::mt19937 rng(20261129);
  auto pick = [&rng](auto values) {
    return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
  };
  std::vector<Case> cases;
  std::string input;
  for (int i = 0; i < 200; ++i) {
    Case c;
    c.power = pick(std::vector<int>{0, 3, 8, 16, 32});
    c.window = pick(std::vector<int64_t>{1, 2, 3, 5, 10, 1000});
    c.hysteresis = pick(std::vector<int>{1, 2, 3});
    c.consecutive = pick(std::vector<bool>{false, true});
    c.min_scale = c.power > 2 ? pick(std::vector<double>{1, 0.25, 4}) : 1;
    const double rate = pick(std::vector<double>{0.02, 0.1, 0.3, 0.7});
    const int length = std::uniform_int_distribution<int>(20, 120)(rng);
    std::bernoulli_distribution overflow(rate);
    for (int k = 0; k < length; ++k) c.sequence += overflow(rng) ? '1' : '0';
    input += fmt::format("{} {} {} {} {} {}\n", c.power, c.window, c.hysteresis,
                         c.consecutive ? 1 : 0, c.min_scale, c.sequence);
    cases.push_back(c);
  }
  testing::ScratchDir dir;
  const std::string cases_file = dir / "cases.txt";
  std::ofstream(cases_file) << input;
  const std::string here = __FILE__;
  const std::string script = here.substr(0, here.rfind('/')) + "/deepspeed_scaler_reference.py";
  const std::string scales_file = dir / "scales.txt";
  std::string output;
  ASSERT_EQ(testing::run_shell_capture(
                python + " " + script + " " + cases_file + " " + scales_file + " 2>&1", output),
            0)
      << output;
  std::ifstream lines(scales_file);
  int compared = 0;
  for (const Case& c : cases) {
    std::string line;
    ASSERT_TRUE(static_cast<bool>(std::getline(lines, line))) << "the peer printed too little";
    std::istringstream want(line);
    DeepSpeedLossScaler scaler(deepspeed_config(c.power, c.window, c.hysteresis, c.consecutive,
                                                c.min_scale),
                               /*max_overflows_at_min_scale=*/1 << 20);
    for (size_t k = 0; k < c.sequence.size(); ++k) {
      double expected = 0;
      ASSERT_TRUE(static_cast<bool>(want >> expected));
      scaler.update(c.sequence[k] == '1');
      ASSERT_EQ(scaler.scale(), expected)
          << "step " << k << " of power " << c.power << " window " << c.window
          << " hysteresis " << c.hysteresis << " consecutive " << c.consecutive << " min "
          << c.min_scale << " sequence " << c.sequence.substr(0, k + 1);
    }
    ++compared;
  }
  EXPECT_EQ(compared, 200);
}

// ---- torch's GradScaler -------------------------------------------------

TEST(GradScalerTest, DefaultsAreTorchs) {
  GradScaler scaler;
  EXPECT_EQ(scaler.rule(), LossScaleRule::kTorch);
  EXPECT_TRUE(scaler.enabled());
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.inv_scale(), 1.0 / 65536.0);
  EXPECT_EQ(scaler.options().growth_factor, 2.0);
  EXPECT_EQ(scaler.options().backoff_factor, 0.5);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
}

// torch's test_grad_scaling_update_scale: growth 2, backoff 0.25, interval 2,
// scale 4: clean -> (tracker 1, scale 4), clean -> (0, 8), inf -> (0, 2).
TEST(GradScalerTest, MatchesTorchsUpdateScaleTest) {
  GradScaler scaler(torch_options(4.0, 2.0, 0.25, 2));
  EXPECT_FALSE(scaler.update(C));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.scale(), 4.0);
  EXPECT_FALSE(scaler.update(C));
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_TRUE(scaler.update(I));
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.scale(), 2.0);
}

// interval 3, scale 8: the scale doubles on every third clean step in a row
// and halves on every overflow, which also restarts the count.
TEST(GradScalerTest, ScriptedPatternGivesHandWorkedSequence) {
  GradScaler scaler(torch_options(8.0, 2.0, 0.5, 3));
  Trace t = run(scaler, {C, C, C, I, C, C, I, C, C, C, C, C, C});
  EXPECT_EQ(t.scales, (std::vector<double>{8, 8, 16, 8, 8, 8, 4, 4, 4, 8, 8, 8, 16}));
  EXPECT_EQ(t.skipped, (std::set<int64_t>{4, 7}));
  EXPECT_EQ(scaler.steps(), 13);
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(GradScalerTest, GrowsAfterExactlyGrowthIntervalCleanSteps) {
  GradScaler scaler;  // interval 2000
  for (int i = 0; i < 1999; ++i) ASSERT_FALSE(scaler.update(C));
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 1999);
  scaler.update(C);
  EXPECT_EQ(scaler.scale(), 131072.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

// torch keeps the scale in float32 and does not grow it past FLT_MAX.
TEST(GradScalerTest, GrowthThatWouldOverflowFloat32IsNotApplied) {
  GradScaler scaler(torch_options(std::ldexp(1.0, 127), 2.0, 0.5, 1));
  scaler.update(C);
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 127));
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScalerTest, DisabledHasScaleOneAndNeverSkips) {
  GradScalerOptions o;
  o.enabled = false;
  GradScaler scaler(o);
  EXPECT_FALSE(scaler.enabled());
  EXPECT_EQ(scaler.rule(), LossScaleRule::kDisabled);
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(scaler.update(I));
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_EQ(scaler.steps(), 50);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScalerTest, RejectsInvalidOptions) {
  EXPECT_THROW(GradScaler(torch_options(0.0, 2, 0.5, 1)), UsageError);
  EXPECT_THROW(GradScaler(torch_options(1e39, 2, 0.5, 1)), UsageError);  // not a float32
  EXPECT_THROW(GradScaler(torch_options(4, 1.0, 0.5, 1)), UsageError);
  EXPECT_THROW(GradScaler(torch_options(4, 2, 1.0, 1)), UsageError);
  EXPECT_THROW(GradScaler(torch_options(4, 2, 0.0, 1)), UsageError);
  EXPECT_THROW(GradScaler(torch_options(4, 2, 0.5, 0)), UsageError);
}

// ---- DeepSpeed's DynamicLossScaler ----------------------------------------

// The expected traces of these tests are DeepSpeed 0.19.8's
// DynamicLossScaler.update_scale fed the same sequences (cur_scale and
// cur_hysteresis after each update), recorded 2026-11-29.

// No overflow, window 2, scale 2^4: stable = cur_iter - (-1) - 1 is a
// positive multiple of 2 at cur_iter 2 and 4: the scale doubles on the
// clean step after every two clean steps.
TEST(DeepSpeedScalerTest, DoublesAfterEveryWindowOfCleanSteps) {
  DeepSpeedLossScaler scaler(deepspeed_config(4, 2, 2));
  Trace t = run(scaler, {C, C, C, C, C, C});
  EXPECT_EQ(t.scales, (std::vector<double>{16, 16, 32, 32, 64, 64}));
  EXPECT_TRUE(t.skipped.empty());
  EXPECT_EQ(scaler.cur_iter(), 6);
}

// Hysteresis 2, window 3, not consecutive: the first overflow only spends
// hysteresis; hysteresis comes back only when the scale grows, which three
// clean steps after an overflow are not enough for.
//   step: 1  2  3  4  5  6  7  8  9
//         I  I  C  C  C  I  C  I  I
//   hyst: 1  1  1  1  1  1  1  1  1
//   scale 16 8  8  8  8  4  4  2  1
TEST(DeepSpeedScalerTest, HysteresisAbsorbsOverflowsUntilTheScaleGrows) {
  DeepSpeedLossScaler scaler(deepspeed_config(4, 3, 2));
  std::vector<bool> pattern = {I, I, C, C, C, I, C, I, I};
  std::vector<int> hysteresis;
  Trace t;
  for (bool found_inf : pattern) {
    if (scaler.update(found_inf)) t.skipped.insert(scaler.steps());
    t.scales.push_back(scaler.scale());
    hysteresis.push_back(scaler.cur_hysteresis());
  }
  EXPECT_EQ(t.scales, (std::vector<double>{16, 8, 8, 8, 8, 4, 4, 2, 1}));
  EXPECT_EQ(hysteresis, (std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(t.skipped, (std::set<int64_t>{1, 2, 6, 8, 9}));
  EXPECT_EQ(scaler.last_overflow_iter(), 8);
  EXPECT_EQ(scaler.cur_iter(), 9);
}

// Same pattern with consecutive_hysteresis: every clean step refills it, so
// the overflows at steps 6 and 8 (each after a clean step) are absorbed.
TEST(DeepSpeedScalerTest, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  DeepSpeedLossScaler scaler(deepspeed_config(4, 3, 2, /*consecutive=*/true));
  Trace t = run(scaler, {I, I, C, C, C, I, C, I, I});
  EXPECT_EQ(t.scales, (std::vector<double>{16, 8, 8, 8, 8, 8, 8, 8, 4}));
  EXPECT_EQ(t.skipped, (std::set<int64_t>{1, 2, 6, 8, 9}));
}

// DeepSpeed's TestZeroStage0Hysteresis: hysteresis 3, four overflows.
TEST(DeepSpeedScalerTest, HysteresisThreeAbsorbsTwoOverflows) {
  DeepSpeedLossScaler scaler(deepspeed_config(8, 1000, 3));
  Trace t = run(scaler, {I, I, I, I});
  EXPECT_EQ(t.scales, (std::vector<double>{256, 256, 128, 64}));
}

// DeepSpeed's test_consecutive_hysteresis: isolated overflows never lower it.
TEST(DeepSpeedScalerTest, IsolatedOverflowsWithConsecutiveHysteresisKeepTheScale) {
  DeepSpeedLossScaler scaler(deepspeed_config(8, 1000, 2, /*consecutive=*/true));
  run(scaler, {I, C, I, C, I, C, I, C});
  EXPECT_EQ(scaler.scale(), 256.0);
}

// DeepSpeed's test_some_overflow: scale 2^8, window 2, hysteresis 1: two
// overflows give 2^6, three clean steps double it once, one overflow halves.
TEST(DeepSpeedScalerTest, MatchesDeepSpeedsSomeOverflowTest) {
  DeepSpeedLossScaler scaler(deepspeed_config(8, 2, 1));
  Trace t = run(scaler, {I, I, C, C, C, I});
  EXPECT_EQ(t.scales, (std::vector<double>{128, 64, 64, 64, 128, 64}));
  EXPECT_EQ(t.skipped, (std::set<int64_t>{1, 2, 6}));
}

TEST(DeepSpeedScalerTest, NeverGoesBelowMinLossScale) {
  DeepSpeedLossScaler scaler(deepspeed_config(4, 2, 1, false, /*min_scale=*/2));
  Trace t = run(scaler, {I, I, I, I, I});
  EXPECT_EQ(t.scales, (std::vector<double>{8, 4, 2, 2, 2}));
}

TEST(DeepSpeedScalerTest, RejectsStaticScaleAndInvalidValues) {
  LossScaleConfig c = deepspeed_config(16, 1000, 2);
  c.loss_scale = 128;
  EXPECT_THROW(DeepSpeedLossScaler{c}, UsageError);
  EXPECT_THROW(DeepSpeedLossScaler{deepspeed_config(16, 0, 2)}, UsageError);
  EXPECT_THROW(DeepSpeedLossScaler{deepspeed_config(16, 10, 0)}, UsageError);
  EXPECT_THROW(DeepSpeedLossScaler(deepspeed_config(16, 10, 2, false, 0.0)), UsageError);
}

// ---- static scale --------------------------------------------------------

TEST(StaticScalerTest, SkipsOverflowingStepsAndNeverMovesTheScale) {
  StaticLossScaler scaler(128.0);
  Trace t = run(scaler, {C, I, C, C, I});
  EXPECT_EQ(t.scales, (std::vector<double>(5, 128.0)));
  EXPECT_EQ(t.skipped, (std::set<int64_t>{2, 5}));
  EXPECT_THROW(StaticLossScaler(0.0), UsageError);
}

// ---- the factory ---------------------------------------------------------

TEST(MakeLossScalerTest, PicksTheScalerFromPrecisionAndFp16Block) {
  LossScaleConfig c;  // defaults: dynamic, 2^16, no window given
  auto bf16 = make_loss_scaler(c, MixedPrecision::kBf16);
  EXPECT_EQ(bf16->rule(), LossScaleRule::kDisabled);
  EXPECT_EQ(bf16->scale(), 1.0);
  EXPECT_FALSE(bf16->update(I));
  EXPECT_EQ(make_loss_scaler(c, MixedPrecision::kNo)->rule(), LossScaleRule::kDisabled);

  auto torch = make_loss_scaler(c, MixedPrecision::kFp16);
  ASSERT_EQ(torch->rule(), LossScaleRule::kTorch);
  EXPECT_EQ(torch->scale(), 65536.0);
  // No window given keeps torch's own interval; any given window is used,
  // DeepSpeed's default value 1000 too.
  EXPECT_EQ(dynamic_cast<GradScaler&>(*torch).options().growth_interval, 2000);
  for (int64_t window : {500, 1000}) {
    LossScaleConfig windowed = c;
    windowed.loss_scale_window = window;
    EXPECT_EQ(dynamic_cast<GradScaler&>(*make_loss_scaler(windowed, MixedPrecision::kFp16))
                  .options()
                  .growth_interval,
              window);
  }

  c.deepspeed_semantics = true;
  c.initial_scale_power = 12;
  auto deepspeed = make_loss_scaler(c, MixedPrecision::kFp16);
  EXPECT_EQ(deepspeed->rule(), LossScaleRule::kDeepSpeed);
  EXPECT_EQ(deepspeed->scale(), 4096.0);

  c.loss_scale = 512;
  auto fixed = make_loss_scaler(c, MixedPrecision::kFp16);
  EXPECT_EQ(fixed->rule(), LossScaleRule::kStatic);
  EXPECT_EQ(fixed->scale(), 512.0);
}

// ---- scale collapse ------------------------------------------------------

// Scale 4, floor 1, K = 3: steps 1 and 2 run at 4 and 2 (above the floor);
// steps 3, 4, 5 run at 1, 0.5, 0.25, so step 5 is the third in a row.
TEST(ScalerCollapseTest, GradScalerThrowsAfterKOverflowsAtTheFloor) {
  GradScalerOptions o = torch_options(4.0, 2.0, 0.5, 2000);
  o.max_overflows_at_min_scale = 3;
  GradScaler scaler(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(scaler.update(I));
  EXPECT_EQ(scaler.overflows_at_min_scale(), 2);
  try {
    scaler.update(I);
    FAIL() << "expected ScaleCollapseError";
  } catch (const ScaleCollapseError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("loss scale collapsed"), std::string::npos) << what;
    EXPECT_NE(what.find("steps 3..5"), std::string::npos) << what;
    EXPECT_NE(what.find("min_loss_scale (1"), std::string::npos) << what;
    EXPECT_NE(what.find("bf16"), std::string::npos) << what;
    EXPECT_NE(what.find("learning rate"), std::string::npos) << what;
    EXPECT_NE(what.find("gradient_clipping"), std::string::npos) << what;
    EXPECT_NE(what.find("Current loss scale already at minimum"), std::string::npos) << what;
  }
  // The step was recorded before the throw.
  EXPECT_EQ(scaler.steps(), 5);
  EXPECT_EQ(scaler.skipped_steps(), 5);
}

TEST(ScalerCollapseTest, ACleanStepRestartsTheCount) {
  GradScalerOptions o = torch_options(1.0, 2.0, 0.5, 2000);
  o.max_overflows_at_min_scale = 3;
  GradScaler scaler(o);
  EXPECT_NO_THROW(run(scaler, {I, I, C, I, I, C, I, I}));
  EXPECT_EQ(scaler.overflows_at_min_scale(), 2);
  EXPECT_THROW(scaler.update(I), ScaleCollapseError);
}

// Scale 2, floor 1, hysteresis 2, K = 2: step 1 (at 2) spends hysteresis,
// step 2 (at 2) halves to 1, steps 3 and 4 run at the floor.
TEST(ScalerCollapseTest, DeepSpeedThrowsAfterKOverflowsAtMinLossScale) {
  DeepSpeedLossScaler scaler(deepspeed_config(1, 1000, 2), /*max_overflows_at_min_scale=*/2);
  EXPECT_TRUE(scaler.update(I));
  EXPECT_TRUE(scaler.update(I));
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_TRUE(scaler.update(I));
  EXPECT_THROW(scaler.update(I), ScaleCollapseError);
  EXPECT_EQ(scaler.steps(), 4);
}

TEST(ScalerCollapseTest, StaticScaleThrowsAfterKConsecutiveOverflows) {
  StaticLossScaler scaler(1024.0, /*max_overflows=*/3);
  run(scaler, {I, I, C, I, I});
  try {
    scaler.update(I);
    FAIL() << "expected ScaleCollapseError";
  } catch (const ScaleCollapseError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("steps 4..6"), std::string::npos) << what;
    EXPECT_NE(what.find("static loss scale 1024"), std::string::npos) << what;
    EXPECT_NE(what.find("fp16.loss_scale: 0"), std::string::npos) << what;
  }
}

TEST(ScalerCollapseTest, ZeroTurnsTheCheckOff) {
  DeepSpeedLossScaler scaler(deepspeed_config(1, 1000, 1), /*max_overflows_at_min_scale=*/0);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(scaler.update(I));
  EXPECT_EQ(scaler.scale(), 1.0);
  EXPECT_EQ(scaler.overflows_at_min_scale(), 99);
}

TEST(ScalerCollapseTest, DisabledScalerNeverThrows) {
  auto scaler = make_loss_scaler({}, MixedPrecision::kBf16, 1);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(scaler->update(I));
}

// ---- checkpoints ---------------------------------------------------------

// Saves mid-run, restores into a fresh scaler, and checks that both continue
// with the same sequence.
void expect_round_trip(LossScaler& original, LossScaler& fresh, const std::vector<bool>& head,
                       const std::vector<bool>& tail) {
  run(original, head);
  const auto saved = original.state_dict();
  fresh.load_state_dict(saved);
  EXPECT_EQ(fresh.state_dict(), saved);
  EXPECT_EQ(fresh.scale(), original.scale());
  EXPECT_EQ(fresh.steps(), original.steps());
  EXPECT_EQ(fresh.skipped_steps(), original.skipped_steps());
  Trace a = run(original, tail);
  Trace b = run(fresh, tail);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.skipped, b.skipped);
}

TEST(ScalerStateDictTest, GradScalerRoundTripContinuesTheSequence) {
  GradScaler original(torch_options(8.0, 2.0, 0.5, 3));
  GradScaler fresh(torch_options(8.0, 2.0, 0.5, 3));
  expect_round_trip(original, fresh, {C, C, C, I, C}, {C, C, I, C, C, C, C});
  const auto state = original.state_dict();
  for (const char* key : {"rule", "steps", "skipped_steps", "overflows_at_min_scale", "scale",
                          "growth_factor", "backoff_factor", "growth_interval",
                          "growth_tracker"}) {
    EXPECT_EQ(state.count(key), 1u) << key;
  }
  EXPECT_EQ(state.size(), 9u);
}

TEST(ScalerStateDictTest, GradScalerRestoresTorchsFactorsToo) {
  GradScaler original(torch_options(8.0, 4.0, 0.25, 5));
  GradScaler fresh;
  fresh.load_state_dict(original.state_dict());
  EXPECT_EQ(fresh.options().growth_factor, 4.0);
  EXPECT_EQ(fresh.options().backoff_factor, 0.25);
  EXPECT_EQ(fresh.options().growth_interval, 5);
  EXPECT_EQ(fresh.scale(), 8.0);
}

// Saved with one overflow's hysteresis spent: the restored scaler halves on
// the next overflow (DeepSpeed's test_hysteresis_survives_a_checkpoint).
TEST(ScalerStateDictTest, DeepSpeedRoundTripKeepsSpentHysteresis) {
  DeepSpeedLossScaler original(deepspeed_config(8, 3, 2));
  DeepSpeedLossScaler fresh(deepspeed_config(8, 3, 2));
  expect_round_trip(original, fresh, {C, I}, {I, C, C, C, I, I});
  DeepSpeedLossScaler another(deepspeed_config(8, 3, 3));
  DeepSpeedLossScaler restored(deepspeed_config(8, 3, 3));
  another.update(I);
  restored.load_state_dict(another.state_dict());
  EXPECT_EQ(restored.cur_hysteresis(), 2);
}

TEST(ScalerStateDictTest, LoadingAnotherRulesStateNamesBothRules) {
  DeepSpeedLossScaler deepspeed(deepspeed_config(8, 3, 2));
  GradScaler torch;
  try {
    torch.load_state_dict(deepspeed.state_dict());
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("saved by a 'deepspeed' scaler but this one is 'torch'"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(torch.scale(), 65536.0);
}

// A scale that underflowed to 0 (a run of overflows with the collapse
// check off, as torch's underflows) is the scaler's own state: it loads.
TEST(ScalerStateDictTest, AScaleThatUnderflowedToZeroLoadsBack) {
  GradScaler scaler(torch_options(8.0, 2.0, 0.5, 3));
  auto state = scaler.state_dict();
  state["scale"] = 0.0;
  GradScaler fresh(torch_options(8.0, 2.0, 0.5, 3));
  fresh.load_state_dict(state);
  EXPECT_EQ(fresh.scale(), 0.0);
}

TEST(ScalerStateDictTest, BadStateChangesNothing) {
  GradScaler scaler(torch_options(8.0, 2.0, 0.5, 3));
  run(scaler, {C, I});
  const auto before = scaler.state_dict();

  auto missing = before;
  missing.erase("growth_tracker");
  EXPECT_THROW(scaler.load_state_dict(missing), UsageError);

  auto unknown = before;
  unknown["growth_trackr"] = 0;
  EXPECT_THROW(scaler.load_state_dict(unknown), UsageError);

  auto bad_scale = before;
  bad_scale["scale"] = -1;
  bad_scale["steps"] = 100;
  EXPECT_THROW(scaler.load_state_dict(bad_scale), UsageError);

  auto bad_tracker = before;
  bad_tracker["growth_tracker"] = 3;  // must be < growth_interval
  EXPECT_THROW(scaler.load_state_dict(bad_tracker), UsageError);

  auto bad_steps = before;
  bad_steps["skipped_steps"] = 5;  // more than steps (2)
  EXPECT_THROW(scaler.load_state_dict(bad_steps), UsageError);

  EXPECT_EQ(scaler.state_dict(), before);
}

}  // namespace
}  // namespace tandem
