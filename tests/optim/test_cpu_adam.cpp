// tandem's CPU Adam/AdamW against LibTorch's torch::optim::Adam and AdamW:
// the raw kernel (cpu_adam_step) and the CpuAdam optimizer, over 100 steps,
// plus bitwise identity across thread counts and ISAs, and the refusals.

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/core/error.h"
#include "tandem/optim/cpu_adam.h"

namespace tandem {
namespace {

constexpr int kSteps = 100;

// How far a is from b against torch.testing's float32 tolerance: the
// largest |a - b| / (atol + rtol * |b|). At most 1 means every element is
// close; 0 means bitwise-equal values (up to the sign of zero). A pure
// relative error is no use here: LibTorch's vectorised kernels may fuse a
// multiply-add where ours rounds twice, and one ulp on a parameter that has
// drifted to 1e-6 is a relative error of 1e-2.
double tolerance_ratio(const torch::Tensor& a, const torch::Tensor& b) {
  constexpr double kAtol = 1e-5;
  constexpr double kRtol = 1.3e-6;
  if (a.numel() == 0) return 0;
  auto diff = (a.to(torch::kDouble) - b.to(torch::kDouble)).abs();
  auto allowed = b.to(torch::kDouble).abs() * kRtol + kAtol;
  return (diff / allowed).max().item<double>();
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * sizeof(float)) == 0;
}

// A fresh gradient per step, the same for both sides.
torch::Tensor grad_for_step(int64_t n, int step) {
  torch::manual_seed(1000 + step);
  return torch::randn({n});
}

struct Case {
  int64_t n;
  double weight_decay;
  bool adamw;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.adamw ? "AdamW" : "Adam") << " n=" << c.n << " weight_decay=" << c.weight_decay;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return (info.param.adamw ? "AdamW_n" : "Adam_n") + std::to_string(info.param.n) +
         (info.param.weight_decay != 0 ? "_decay" : "_nodecay");
}

class CpuAdamKernelVsTorch : public ::testing::TestWithParam<Case> {};

// cpu_adam_step on flat arrays tracks torch's optimizer for 100 steps within
// torch.testing's float32 tolerance (atol 1e-5, rtol 1.3e-6).
TEST_P(CpuAdamKernelVsTorch, HundredStepsMatchWithinFloat32Tolerance) {
  const Case c = GetParam();
  torch::manual_seed(7);
  torch::Tensor ref = torch::randn({c.n}).requires_grad_(true);
  torch::Tensor param = ref.detach().clone();
  torch::Tensor exp_avg = torch::zeros({c.n});
  torch::Tensor exp_avg_sq = torch::zeros({c.n});

  AdamHyperparams h;
  h.lr = 1e-2;
  h.weight_decay = c.weight_decay;
  h.decoupled_weight_decay = c.adamw;
  std::unique_ptr<torch::optim::Optimizer> torch_opt;
  if (c.adamw) {
    torch_opt = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::Tensor>{ref}, torch::optim::AdamWOptions(h.lr).weight_decay(h.weight_decay));
  } else {
    torch_opt = std::make_unique<torch::optim::Adam>(
        std::vector<torch::Tensor>{ref}, torch::optim::AdamOptions(h.lr).weight_decay(h.weight_decay));
  }

  for (int step = 1; step <= kSteps; ++step) {
    torch::Tensor grad = grad_for_step(c.n, step);
    ref.mutable_grad() = grad.clone();
    torch_opt->step();
    cpu_adam_step(param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                  exp_avg_sq.data_ptr<float>(), c.n, step, h, /*threads=*/2);
  }
  if (c.n == 0) return;
  const auto& state = torch_opt->state().begin()->second;
  torch::Tensor ref_avg, ref_avg_sq;
  if (c.adamw) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
    ref_avg = s.exp_avg();
    ref_avg_sq = s.exp_avg_sq();
  } else {
    auto& s = static_cast<torch::optim::AdamParamState&>(*state);
    ref_avg = s.exp_avg();
    ref_avg_sq = s.exp_avg_sq();
  }
  EXPECT_LE(tolerance_ratio(param, ref.detach()), 1.0);
  EXPECT_LE(tolerance_ratio(exp_avg, ref_avg), 1.0);
  EXPECT_LE(tolerance_ratio(exp_avg_sq, ref_avg_sq), 1.0);
  RecordProperty("bitwise_equal_param", bitwise_equal(param, ref.detach()) ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CpuAdamKernelVsTorch,
                         ::testing::Values(Case{0, 0.0, false}, Case{1, 0.0, false},
                                         Case{63, 0.1, false}, Case{1000003, 0.0, false},
                                         Case{1000003, 0.1, false}, Case{0, 0.1, true},
                                         Case{1, 0.1, true}, Case{63, 0.0, true},
                                         Case{1000003, 0.0, true}, Case{1000003, 0.1, true}),
                         case_name);

// Runs `steps` steps on a copy of fixed data; returns param, exp_avg, exp_avg_sq.
std::vector<torch::Tensor> run_kernel(int64_t n, int threads, bool adamw, int steps = 5) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> t = {torch::randn({n}), torch::zeros({n}), torch::zeros({n})};
  AdamHyperparams h;
  h.lr = 1e-2;
  h.weight_decay = 0.05;
  h.decoupled_weight_decay = adamw;
  for (int step = 1; step <= steps; ++step) {
    torch::Tensor grad = grad_for_step(n, step);
    cpu_adam_step(t[0].data_ptr<float>(), grad.data_ptr<float>(), t[1].data_ptr<float>(),
                  t[2].data_ptr<float>(), n, step, h, threads);
  }
  return t;
}

// Restores automatic ISA selection even when an assertion fails.
struct IsaGuard {
  ~IsaGuard() { detail::set_cpu_adam_isa_for_testing(nullptr); }
};

// On every path this CPU has: the threads' split must not change any bit.
TEST(CpuAdamKernel, BitwiseIdenticalForOneTwoThreeAndSevenThreads) {
  IsaGuard guard;
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (!detail::cpu_adam_isa_supported(isa)) continue;
    detail::set_cpu_adam_isa_for_testing(isa);
    for (int64_t n : {int64_t{77}, int64_t{4099 * 7 + 13}, int64_t{1000003}}) {
      for (bool adamw : {false, true}) {
        const auto one = run_kernel(n, 1, adamw);
        for (int threads : {2, 3, 7}) {
          const auto many = run_kernel(n, threads, adamw);
          for (int k = 0; k < 3; ++k) {
            EXPECT_TRUE(bitwise_equal(one[k], many[k])) << isa << " n=" << n << " threads="
                                                        << threads << " adamw=" << adamw
                                                        << " array " << k;
          }
        }
      }
    }
  }
}

TEST(CpuAdamKernel, BitwiseIdenticalAcrossEverySupportedIsa) {
  IsaGuard guard;
  int compared = 0;
  for (int64_t n : {int64_t{1}, int64_t{77}, int64_t{100003}}) {
    for (bool adamw : {false, true}) {
      detail::set_cpu_adam_isa_for_testing("scalar");
      ASSERT_STREQ(cpu_adam_isa(), "scalar");
      const auto scalar = run_kernel(n, 2, adamw);
      for (const char* isa : {"avx2", "avx512"}) {
        if (!detail::cpu_adam_isa_supported(isa)) continue;
        detail::set_cpu_adam_isa_for_testing(isa);
        ASSERT_STREQ(cpu_adam_isa(), isa);
        const auto vector = run_kernel(n, 2, adamw);
        for (int k = 0; k < 3; ++k) {
          EXPECT_TRUE(bitwise_equal(scalar[k], vector[k]))
              << isa << " n=" << n << " adamw=" << adamw << " array " << k;
        }
        ++compared;
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "this CPU has neither AVX2+FMA nor AVX-512F";
}

TEST(CpuAdamKernel, AutomaticIsaIsTheWidestTheCpuHas) {
  const std::string isa = cpu_adam_isa();
  if (detail::cpu_adam_isa_supported("avx512")) {
    EXPECT_EQ(isa, "avx512");
  } else if (detail::cpu_adam_isa_supported("avx2")) {
    EXPECT_EQ(isa, "avx2");
  } else {
    EXPECT_EQ(isa, "scalar");
  }
  EXPECT_THROW(detail::set_cpu_adam_isa_for_testing("sse9"), UsageError);
}

TEST(CpuAdamKernel, RefusesBadArgumentsBeforeTouchingMemory) {
  float p = 1, g = 1, m = 0, v = 0;
  AdamHyperparams h;
  EXPECT_THROW(cpu_adam_step(&p, &g, &m, &v, -1, 1, h), UsageError);
  EXPECT_THROW(cpu_adam_step(&p, &g, &m, &v, 1, 0, h), UsageError);
  EXPECT_THROW(cpu_adam_step(nullptr, &g, &m, &v, 1, 1, h), UsageError);
  h.beta2 = 1.0;
  EXPECT_THROW(cpu_adam_step(&p, &g, &m, &v, 1, 1, h), UsageError);
  h = AdamHyperparams{};
  h.lr = -1;
  EXPECT_THROW(cpu_adam_step(&p, &g, &m, &v, 1, 1, h), UsageError);
  EXPECT_EQ(p, 1.0f);
  EXPECT_EQ(m, 0.0f);
  EXPECT_NO_THROW(cpu_adam_step(nullptr, nullptr, nullptr, nullptr, 0, 1, AdamHyperparams{}));
}

// Two identical small models, one stepped by torch's optimizer and one by
// CpuAdam, with two param groups of different learning rates.
template <typename TorchOptimizer, typename Options>
void expect_optimizer_parity(Options options) {
  torch::manual_seed(11);
  torch::nn::Sequential ref(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  torch::nn::Sequential ours(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 4));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < ref->parameters().size(); ++i) {
      ours->parameters()[i].copy_(ref->parameters()[i]);
    }
  }
  auto groups = [&options](torch::nn::Sequential& model) {
    auto first = model[0]->parameters();
    auto last = model[2]->parameters();
    Options slow = options;
    slow.lr(options.lr() / 4);
    return std::vector<torch::optim::OptimizerParamGroup>{
        torch::optim::OptimizerParamGroup(first),
        torch::optim::OptimizerParamGroup(last, std::make_unique<Options>(slow))};
  };
  TorchOptimizer torch_opt(groups(ref), options);
  CpuAdam cpu_opt(groups(ours), options, /*threads=*/2);

  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({64, 16});
  const torch::Tensor y = torch::randn({64, 4});
  auto train_step = [&x, &y](torch::nn::Sequential& model, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  };
  for (int step = 0; step < kSteps; ++step) {
    train_step(ref, torch_opt);
    train_step(ours, cpu_opt);
  }
  for (size_t i = 0; i < ref->parameters().size(); ++i) {
    EXPECT_LE(tolerance_ratio(ours->parameters()[i], ref->parameters()[i]), 1.0) << "param " << i;
  }
}

TEST(CpuAdamOptimizer, MatchesTorchAdamOverHundredStepsWithAndWithoutWeightDecay) {
  expect_optimizer_parity<torch::optim::Adam>(torch::optim::AdamOptions(1e-2));
  expect_optimizer_parity<torch::optim::Adam>(torch::optim::AdamOptions(1e-2).weight_decay(0.1));
}

TEST(CpuAdamOptimizer, MatchesTorchAdamWOverHundredStepsWithAndWithoutWeightDecay) {
  expect_optimizer_parity<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2));
  expect_optimizer_parity<torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
}

TEST(CpuAdamOptimizer, CheckpointLoadsIntoTorchAdamAndBothContinueAlike) {
  torch::manual_seed(5);
  torch::Tensor a = torch::randn({1000}, torch::requires_grad());
  torch::Tensor b = a.detach().clone().requires_grad_(true);
  CpuAdam ours({a}, torch::optim::AdamOptions(1e-2));
  torch::optim::Adam theirs({b}, torch::optim::AdamOptions(1e-2));
  for (int step = 1; step <= 3; ++step) {
    a.mutable_grad() = grad_for_step(1000, step);
    ours.step();
  }
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    ours.save(archive);
    archive.save_to(stream);
  }
  {
    torch::NoGradGuard no_grad;
    b.copy_(a);
  }
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  theirs.load(archive);
  for (int step = 4; step <= 6; ++step) {
    a.mutable_grad() = grad_for_step(1000, step);
    b.mutable_grad() = grad_for_step(1000, step);
    ours.step();
    theirs.step();
  }
  EXPECT_LE(tolerance_ratio(a.detach(), b.detach()), 1.0);
}

TEST(CpuAdamOptimizer, RefusesAmsgradWithAUsageError) {
  torch::Tensor p = torch::zeros({4}, torch::requires_grad());
  EXPECT_THROW(CpuAdam({p}, torch::optim::AdamOptions().amsgrad(true)), UsageError);
  EXPECT_THROW(CpuAdam({p}, torch::optim::AdamWOptions().amsgrad(true)), UsageError);
  try {
    CpuAdam({p}, torch::optim::AdamOptions().amsgrad(true));
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("amsgrad"), std::string::npos) << e.what();
  }
  // A group added later with amsgrad is refused at step().
  CpuAdam optimizer({p}, torch::optim::AdamOptions());
  torch::Tensor q = torch::zeros({4}, torch::requires_grad());
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(
      {q}, std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions().amsgrad(true))));
  q.mutable_grad() = torch::ones({4});
  EXPECT_THROW(optimizer.step(), UsageError);
}

TEST(CpuAdamOptimizer, RefusesNonFloatAndNonContiguousParameters) {
  torch::Tensor wide = torch::zeros({4}, torch::dtype(torch::kDouble).requires_grad(true));
  wide.mutable_grad() = torch::ones({4}, torch::kDouble);
  CpuAdam doubles({wide}, torch::optim::AdamOptions());
  EXPECT_THROW(doubles.step(), UsageError);

  torch::Tensor strided = torch::zeros({4, 4}).t().requires_grad_(true);
  strided.mutable_grad() = torch::ones({4, 4});
  CpuAdam transposed({strided}, torch::optim::AdamOptions());
  EXPECT_THROW(transposed.step(), UsageError);
}

TEST(CpuAdamOptimizer, SkipsParamsWithoutGradAndBumpsTheVersionOfUpdatedOnes) {
  torch::Tensor with = torch::ones({8}, torch::requires_grad());
  torch::Tensor without = torch::ones({8}, torch::requires_grad());
  CpuAdam optimizer({with, without}, torch::optim::AdamWOptions(0.1));
  EXPECT_TRUE(optimizer.decoupled_weight_decay());
  with.mutable_grad() = torch::ones({8});
  const auto version = with._version();
  optimizer.step();
  EXPECT_GT(with._version(), version);
  EXPECT_EQ(optimizer.state().size(), 1u);
  EXPECT_TRUE(torch::equal(without, torch::ones({8})));
  EXPECT_FALSE(torch::equal(with, torch::ones({8})));
}

}  // namespace
}  // namespace tandem
