// The fused Adam/AdamW step (src/optim/fused_adam.h) against LibTorch's own
// per-parameter step. The kernels have a CPU build too, so the bookkeeping
// (state creation and reuse, step counts, groups, parameters without a
// gradient, the cases it declines) is specified here; tests/gpu runs the
// CUDA kernels.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "optim/fused_adam.h"

namespace tandem::detail {
namespace {

// Two groups of odd-sized parameters (a matrix, a vector, a scalar), a
// third parameter in group 1 that never gets a gradient.
struct Params {
  std::vector<torch::Tensor> a, b;
  torch::Tensor frozen;
};

Params make_params() {
  torch::manual_seed(3);
  Params p;
  p.a = {torch::randn({7, 5}).requires_grad_(), torch::randn({13}).requires_grad_()};
  p.b = {torch::randn({}).requires_grad_(), torch::randn({3, 1, 2}).requires_grad_()};
  p.frozen = torch::randn({4}).requires_grad_();
  return p;
}

Params clone(const Params& p) {
  auto copy = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(); };
  Params out;
  for (const auto& t : p.a) out.a.push_back(copy(t));
  for (const auto& t : p.b) out.b.push_back(copy(t));
  out.frozen = copy(p.frozen);
  return out;
}

// Gradients from step `k`, identical for both copies.
void set_grads(Params& p, int k) {
  torch::manual_seed(100 + k);
  for (auto* list : {&p.a, &p.b}) {
    for (auto& t : *list) t.mutable_grad() = torch::randn_like(t) * (1 + k % 3);
  }
}

template <class Optimizer, class Options>
std::unique_ptr<Optimizer> make(Params& p, Options group_a, Options group_b) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto a = p.a;
  a.push_back(p.frozen);
  groups.emplace_back(a, std::make_unique<Options>(group_a));
  groups.emplace_back(p.b, std::make_unique<Options>(group_b));
  return std::make_unique<Optimizer>(groups, group_a);
}

double max_rel_diff(const Params& x, const Params& y) {
  double worst = 0;
  auto cmp = [&](const torch::Tensor& u, const torch::Tensor& v) {
    const double scale = std::max(1e-3, v.abs().max().item<double>());
    worst = std::max(worst, (u - v).abs().max().item<double>() / scale);
  };
  for (size_t i = 0; i < x.a.size(); ++i) cmp(x.a[i], y.a[i]);
  for (size_t i = 0; i < x.b.size(); ++i) cmp(x.b[i], y.b[i]);
  cmp(x.frozen, y.frozen);
  return worst;
}

// Steps `plain_steps` with LibTorch, then `fused_steps` fused on one copy and
// plain on the other; returns the worst relative difference.
template <class Optimizer, class Options>
void expect_like_libtorch(Options group_a, Options group_b, int plain_steps, int fused_steps) {
  Params fused = make_params(), plain = clone(fused);
  auto fused_opt = make<Optimizer>(fused, group_a, group_b);
  auto plain_opt = make<Optimizer>(plain, group_a, group_b);
  for (int k = 0; k < plain_steps + fused_steps; ++k) {
    set_grads(fused, k);
    set_grads(plain, k);
    if (k < plain_steps) {
      fused_opt->step();
    } else {
      ASSERT_TRUE(try_fused_adam_step(*fused_opt, /*any_device=*/true)) << "step " << k;
    }
    plain_opt->step();
  }
  EXPECT_LT(max_rel_diff(fused, plain), 1e-5);
  EXPECT_TRUE(torch::equal(fused.frozen, plain.frozen));
  // The state lives where LibTorch keeps it: same step counts, same keys.
  ASSERT_EQ(fused_opt->state().size(), plain_opt->state().size());
  EXPECT_EQ(fused_opt->state().count(fused.frozen.unsafeGetTensorImpl()), 0u);
  for (size_t i = 0; i < fused.a.size(); ++i) {
    auto* state = fused_opt->state().at(fused.a[i].unsafeGetTensorImpl()).get();
    auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state);
    auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state);
    ASSERT_TRUE(adamw != nullptr || adam != nullptr);
    EXPECT_EQ(adamw ? adamw->step() : adam->step(), plain_steps + fused_steps);
  }
}

TEST(FusedAdam, AdamWMatchesLibTorchsStepFromTheFirstStep) {
  expect_like_libtorch<torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).weight_decay(0.1),
      torch::optim::AdamWOptions(3e-3).betas({0.8, 0.99}).eps(1e-6).weight_decay(0), 0, 25);
}

TEST(FusedAdam, AdamWithL2DecayAndAmsgradMatchLibTorch) {
  expect_like_libtorch<torch::optim::Adam>(
      torch::optim::AdamOptions(1e-2).weight_decay(0.05),
      torch::optim::AdamOptions(2e-2).amsgrad(true), 0, 25);
  expect_like_libtorch<torch::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).amsgrad(true),
      torch::optim::AdamWOptions(1e-2).amsgrad(true).weight_decay(0.3), 0, 25);
}

TEST(FusedAdam, ContinuesAStateLibTorchStarted) {
  // As after a checkpoint restore or a step taken before prepare().
  expect_like_libtorch<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2),
                                            torch::optim::AdamWOptions(5e-3), 4, 10);
}

TEST(FusedAdam, DeclinesWhatItCannotFuseAndChangesNothing) {
  auto check_declined = [](torch::optim::Optimizer& opt, const torch::Tensor& p,
                           bool any_device, const char* what) {
    const torch::Tensor before = p.detach().clone();
    const size_t states = opt.state().size();
    EXPECT_FALSE(try_fused_adam_step(opt, any_device)) << what;
    EXPECT_TRUE(torch::equal(p, before)) << what;
    EXPECT_EQ(opt.state().size(), states) << what;
  };
  auto w = torch::randn({4, 3}).requires_grad_();
  w.mutable_grad() = torch::randn({4, 3});
  {
    torch::optim::AdamW adamw({w}, torch::optim::AdamWOptions(1e-2));
    check_declined(adamw, w, /*any_device=*/false, "CPU parameters without any_device");
  }
  {
    torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
    check_declined(sgd, w, true, "not Adam");
  }
  {
    torch::optim::AdamW adamw({w, w}, torch::optim::AdamWOptions(1e-2));
    check_declined(adamw, w, true, "a parameter listed twice");
  }
  {
    auto t = torch::randn({3, 4}).t().requires_grad_();  // strides differ from its grad's
    t.mutable_grad() = torch::randn({4, 3});
    torch::optim::AdamW adamw({t}, torch::optim::AdamWOptions(1e-2));
    check_declined(adamw, t, true, "a gradient laid out unlike its parameter");
  }
  {
    auto h = torch::randn({5}, torch::kDouble).requires_grad_();
    h.mutable_grad() = torch::randn({5}, torch::kFloat);
    torch::optim::Adam adam({h}, torch::optim::AdamOptions(1e-2));
    check_declined(adam, h, true, "a gradient of another dtype");
  }
}

// A gradient whose strides differ from its parameter's only on a dimension
// of size 1 (backward may lay those out either way) addresses the same
// elements: the kernels take it viewed with the parameter's strides, as the
// captured step does, instead of leaving the step to LibTorch's loop.
TEST(FusedAdam, AGradientStridedDifferentlyOnlyOnSizeOneDimensionsIsFused) {
  auto p = torch::randn({4, 1}).requires_grad_();  // strides [1, 1]
  auto q = p.detach().clone().requires_grad_();
  const auto grad = torch::randn({1, 4}).t();  // [4, 1] with strides [1, 4]
  ASSERT_NE(grad.strides(), p.strides());
  p.mutable_grad() = grad;
  q.mutable_grad() = grad.contiguous();
  const auto before = p.detach().clone();
  torch::optim::AdamW fused({p}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW plain({q}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  ASSERT_TRUE(try_fused_adam_step(fused, /*any_device=*/true));
  plain.step();
  EXPECT_FALSE(torch::equal(p, before)) << "the step moved nothing";
  EXPECT_TRUE(torch::allclose(p, q, 1e-6, 1e-7));
}

TEST(FusedAdam, AParameterWithoutAGradientGetsNoStateAndNoDecay) {
  auto used = torch::randn({6}).requires_grad_();
  auto unused = torch::randn({6}).requires_grad_();
  used.mutable_grad() = torch::ones({6});
  const torch::Tensor before = unused.detach().clone();
  torch::optim::AdamW adamw({used, unused}, torch::optim::AdamWOptions(1e-2).weight_decay(0.5));
  ASSERT_TRUE(try_fused_adam_step(adamw, true));
  EXPECT_TRUE(torch::equal(unused, before));
  EXPECT_EQ(adamw.state().size(), 1u);
}

}  // namespace
}  // namespace tandem::detail
