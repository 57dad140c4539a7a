// The gradient checks of a captured step (accelerate/captured_gradients.h),
// on the CPU: which parameters a backward reached, seen by hooks that go
// away with their owner; and a gradient viewed with its parameter's strides
// where they differ only on dimensions of size 1. The captured step itself
// runs on a GPU (tests/gpu/test_gpu_cuda_graph_state.cpp).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "accelerate/captured_gradients.h"
#include "support/usage_error.h"

namespace tandem::detail {
namespace {

TEST(CapturedGradients, HooksSeeWhichParametersABackwardReached) {
  auto used = torch::randn({3, 2}).requires_grad_(true);
  auto unused = torch::randn({5}).requires_grad_(true);
  {
    ReachedHooks hooks({used, unused});
    (used * 2).sum().backward();
    const std::string message = testing::usage_error_message([&] { hooks.check(); });
    EXPECT_NE(message.find("a parameter of shape [5]"), std::string::npos) << message;
    EXPECT_NE(message.find("got no gradient in the captured step"), std::string::npos) << message;
  }
  {
    ReachedHooks hooks({used, unused});
    (used.sum() + unused.sum()).backward();
    EXPECT_EQ(testing::usage_error_message([&] { hooks.check(); }), "");
  }
  // The hooks went with their owners: a backward now runs none of them.
  used.mutable_grad() = at::Tensor();
  (used * 3).sum().backward();
  EXPECT_TRUE(torch::equal(used.grad(), torch::full({3, 2}, 3.0)));
}

TEST(CapturedGradients, AnUndefinedGradientReachesNothing) {
  auto param = torch::randn({4}).requires_grad_(true);
  ReachedHooks hooks({param});
  // A hook called with an undefined gradient (a function that returned none
  // for this input) does not count it as reached.
  struct NoGradient : torch::autograd::Function<NoGradient> {
    static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
      return x.detach() * 2;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                   torch::autograd::variable_list) {
      return {at::Tensor()};
    }
  };
  NoGradient::apply(param).sum().backward();
  EXPECT_FALSE(param.grad().defined());
  EXPECT_NE(testing::usage_error_message([&] { hooks.check(); }).find("shape [4]"),
            std::string::npos);
}

TEST(CapturedGradients, StridesDifferingOnlyOnSizeOneDimensionsAreTheParametersOnes) {
  auto param = torch::randn({1, 4});  // strides (4, 1)
  auto storage = torch::arange(4, torch::kFloat);
  auto grad = storage.as_strided({1, 4}, {1, 1});  // the same elements, stride 1 on the size-1 dim
  ASSERT_NE(grad.strides(), param.strides());
  const at::Tensor viewed = with_strides_of(param, grad);
  EXPECT_EQ(viewed.strides(), param.strides());
  EXPECT_EQ(viewed.data_ptr(), grad.data_ptr()) << "a view, not a copy";
  EXPECT_TRUE(torch::equal(viewed, grad));
  // A real layout difference is left alone (the caller's kernel refuses it).
  auto square = torch::randn({3, 3});
  auto transposed = torch::randn({3, 3}).t();
  EXPECT_EQ(with_strides_of(square, transposed).strides(), transposed.strides());
}

}  // namespace
}  // namespace tandem::detail
