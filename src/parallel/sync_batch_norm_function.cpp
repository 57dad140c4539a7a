#include "parallel/sync_batch_norm_function.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Statistics and the arithmetic on them run in float for float and
// reduced-precision inputs and in double for double inputs, as in ATen.
at::ScalarType stats_dtype(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Every dimension but the channel one (1).
std::vector<int64_t> reduce_dims(const at::Tensor& input) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d != 1) dims.push_back(d);
  }
  return dims;
}

// [1, C, 1, ...]: a per-channel vector viewed this way broadcasts over (N, C, *).
std::vector<int64_t> channel_shape(const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return shape;
}

// ctx->saved_data holds only IValues; a capsule carries the group to backward
// and keeps it alive as long as the graph.
struct ProcessGroupCapsule : torch::CustomClassHolder {
  explicit ProcessGroupCapsule(std::shared_ptr<ProcessGroup> group) : pg(std::move(group)) {}
  std::shared_ptr<ProcessGroup> pg;
};

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  // y = (x - mean) * invstd * weight + bias, with mean/invstd already global.
  // weight and bias come as optionals: Function::apply counts an undefined
  // at::Tensor argument as an input but skips an empty optional.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            const c10::optional<at::Tensor>& weight_arg,
                            const c10::optional<at::Tensor>& bias_arg, const at::Tensor& mean,
                            const at::Tensor& invstd, int64_t count,
                            std::shared_ptr<ProcessGroup> pg) {
    const at::Tensor weight = weight_arg.value_or(at::Tensor());
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    const auto shape = channel_shape(input);
    const auto dtype = invstd.scalar_type();
    // Folding the affine transform into one scale and shift per channel makes
    // the elementwise part a single pass, as ATen's CPU kernel does.
    auto scale = weight.defined() ? invstd * weight.to(dtype) : invstd;
    auto shift = bias.defined() ? bias.to(dtype) - mean * scale : -mean * scale;
    auto output = at::addcmul(shift.view(shape), input.to(dtype), scale.view(shape));

    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["pg"] =
        c10::IValue::make_capsule(c10::make_intrusive<ProcessGroupCapsule>(std::move(pg)));
    return output.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The formula below is written with differentiable ops but the all-reduce
    // inside it is not, so a second derivative would silently be local only.
    TANDEM_CHECK_ARG(!at::GradMode::is_enabled(),
                     "SyncBatchNorm is not twice differentiable: its backward all-reduces "
                     "gradient statistics across ranks, which autograd cannot differentiate. "
                     "Run backward without create_graph=true through SyncBatchNorm.");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const int64_t count = ctx->saved_data["count"].toInt();
    const auto capsule = c10::static_intrusive_pointer_cast<ProcessGroupCapsule>(
        ctx->saved_data["pg"].toCapsule());

    const auto shape = channel_shape(input);
    const auto dims = reduce_dims(input);
    const auto dtype = invstd.scalar_type();
    const auto dy = grad_outputs[0].to(dtype);
    auto xmu = input.to(dtype) - mean.view(shape);
    const auto sum_dy = dy.sum(dims);
    const auto sum_dy_xmu = (dy * xmu).sum(dims);

    // grad_weight and grad_bias stay local sums, as in PyTorch: DDP averages
    // them with every other gradient afterwards.
    at::Tensor grad_input, grad_weight, grad_bias;
    if (weight.defined() && ctx->needs_input_grad(1)) {
      grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    }
    if (weight.defined() && ctx->needs_input_grad(2)) {
      grad_bias = sum_dy.to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(0)) {
      // Same condition on every rank (same model), so the collective matches.
      const int64_t channels = sum_dy.size(0);
      auto packed = at::cat({sum_dy, sum_dy_xmu});
      capsule->pg->all_reduce(packed, ReduceOp::kSum);
      const auto mean_dy = packed.slice(0, 0, channels).div(count);
      const auto mean_dy_xmu = packed.slice(0, channels, 2 * channels).div(count);
      const auto w_invstd = weight.defined() ? invstd * weight.to(dtype) : invstd;
      // dx = (dy - mean(dy) - (x - mean) * invstd^2 * mean(dy * (x - mean))) * invstd * w
      xmu.mul_((invstd * invstd * mean_dy_xmu).view(shape));
      grad_input = (dy - mean_dy.view(shape)).sub_(xmu).mul_(w_invstd.view(shape));
      grad_input = grad_input.to(input.scalar_type());
    }
    // One entry per forward argument; the non-differentiable ones get none.
    return {grad_input, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

GlobalBatchStats all_reduce_batch_stats(const at::Tensor& input, ProcessGroup& pg) {
  const int64_t channels = input.size(1);
  const int64_t local_count = channels == 0 ? 0 : input.numel() / channels;
  const auto dtype = stats_dtype(input);
  const auto options = input.options().dtype(at::kDouble);

  at::Tensor sum, sum_of_squares;
  if (local_count > 0) {
    // var_mean is stable (Welford); only the cross-rank combination below
    // subtracts large numbers, and it does so in double.
    auto [var, mean] = at::var_mean(input.to(dtype), reduce_dims(input), /*unbiased=*/false,
                                    /*keepdim=*/false);
    const auto mean64 = mean.to(at::kDouble);
    sum = mean64 * static_cast<double>(local_count);
    sum_of_squares = (var.to(at::kDouble) + mean64 * mean64) * static_cast<double>(local_count);
  } else {
    sum = at::zeros({channels}, options);
    sum_of_squares = at::zeros({channels}, options);
  }
  auto packed =
      at::cat({sum, sum_of_squares, at::full({1}, static_cast<double>(local_count), options)});
  pg.all_reduce(packed, ReduceOp::kSum);

  GlobalBatchStats stats;
  stats.count = std::llround(packed[2 * channels].item<double>());
  // An empty global batch is rejected by the caller; avoid 0/0 meanwhile.
  const double divisor = static_cast<double>(std::max<int64_t>(stats.count, 1));
  const auto mean = packed.slice(0, 0, channels).div(divisor);
  const auto var =
      packed.slice(0, channels, 2 * channels).div(divisor).sub(mean * mean).clamp_min(0.0);
  stats.mean = mean.to(dtype);
  stats.var = var.to(dtype);
  return stats;
}

at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const GlobalBatchStats& stats, double eps,
                           std::shared_ptr<ProcessGroup> pg) {
  TANDEM_CHECK(pg != nullptr, "sync_batch_norm needs a process group");
  const auto invstd = stats.var.add(eps).rsqrt();
  const auto optional = [](const at::Tensor& t) {
    return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
  };
  return SyncBatchNormFunction::apply(input, optional(weight), optional(bias), stats.mean, invstd,
                                      stats.count, std::move(pg));
}

}  // namespace tandem::detail
