// fused_layer_norm and fused_add_layer_norm: tandem's CUDA kernels behind
// autograd functions where the build has them, LibTorch's fp32 layer_norm
// and a cast (after the add) elsewhere.

#include "tandem/amp/fused_layer_norm.h"

#include <vector>

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <torch/autograd.h>

#include "amp/cuda_kernels_config.h"
#include "amp/kernel_value_type.h"
#include "tandem/core/error.h"

#if TANDEM_CUDA_KERNELS_BUILT
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "amp/kernel_launch.h"
#include "amp/layer_norm_cuda.h"
#endif

namespace tandem {
namespace {

at::ScalarType layer_norm_output_dtype(const at::Tensor& input,
                                       const FusedLayerNormOptions& options) {
  return options.output_dtype.value_or(input.scalar_type());
}

// How a refusal names the call and its normalised tensor.
struct CallNames {
  const char* op;
  const char* input;
};
constexpr CallNames kLayerNormNames{"fused_layer_norm", "the input"};
constexpr CallNames kAddLayerNormNames{"fused_add_layer_norm", "residual"};

void check_layer_norm_affine(const at::Tensor& param, const char* what, int64_t columns,
                             const at::Tensor& input, CallNames names) {
  if (!param.defined()) return;
  TANDEM_CHECK_ARG(param.dim() == 1 && param.size(0) == columns,
                   "{}: {} of shape {} for rows of {}; pass [{}] (or an undefined tensor for "
                   "none)",
                   names.op, what, c10::str(param.sizes()), columns, columns);
  TANDEM_CHECK_ARG(param.device() == input.device(),
                   "{}: {} is on {} and {} on {}; move both to one device", names.op, what,
                   param.device().str(), names.input, input.device().str());
  // The parameters stay fp32 under mixed precision (the kernels read them as
  // float); a bf16 model's LayerNorm is refused here rather than by ATen.
  TANDEM_CHECK_ARG(param.scalar_type() == at::kFloat,
                   "{}: {} is {}; the LayerNorm's weight and bias must be float32 (keep them "
                   "fp32 under mixed precision, or call {}.to(torch::kFloat))",
                   names.op, what, c10::toString(param.scalar_type()), what);
}

void check_value_dtype(const at::Tensor& t, const char* what, CallNames names) {
  TANDEM_CHECK_ARG(t.defined(), "{}: {} is an undefined tensor", names.op, what);
  TANDEM_CHECK_ARG(cuda_kernels::kernel_value_type(t.scalar_type()).has_value(),
                   "{}: {} is {}; pass float32, bfloat16 or float16", names.op, what,
                   c10::toString(t.scalar_type()));
}

void check_layer_norm_inputs(const at::Tensor& input, const at::Tensor& weight,
                             const at::Tensor& bias, const FusedLayerNormOptions& options,
                             CallNames names = kLayerNormNames) {
  check_value_dtype(input, names.input, names);
  TANDEM_CHECK_ARG(
      cuda_kernels::kernel_value_type(layer_norm_output_dtype(input, options)).has_value(),
      "{}: output_dtype {}; choose float32, bfloat16 or float16", names.op,
      c10::toString(layer_norm_output_dtype(input, options)));
  TANDEM_CHECK_ARG(input.dim() >= 1 && input.size(-1) > 0,
                   "{}: {} of shape {} has no dimension to normalise", names.op, names.input,
                   c10::str(input.sizes()));
  TANDEM_CHECK_ARG(options.eps >= 0, "{}: eps is {}; it must be >= 0", names.op, options.eps);
  check_layer_norm_affine(weight, "weight", input.size(-1), input, names);
  check_layer_norm_affine(bias, "bias", input.size(-1), input, names);
}

// The sum's dtype: residual + delta's promotion.
at::ScalarType add_sum_dtype(const at::Tensor& residual, const at::Tensor& delta) {
  return at::promote_types(residual.scalar_type(), delta.scalar_type());
}

// options with the output dtype made explicit: the sum's when not given.
FusedLayerNormOptions add_layer_norm_options(const at::Tensor& residual, const at::Tensor& delta,
                                             const FusedLayerNormOptions& options) {
  FusedLayerNormOptions explicit_options = options;
  if (!explicit_options.output_dtype) {
    explicit_options.output_dtype = add_sum_dtype(residual, delta);
  }
  return explicit_options;
}

void check_add_layer_norm_inputs(const at::Tensor& residual, const at::Tensor& delta,
                                 const at::Tensor& weight, const at::Tensor& bias,
                                 const FusedLayerNormOptions& options) {
  check_value_dtype(residual, "residual", kAddLayerNormNames);
  check_value_dtype(delta, "delta", kAddLayerNormNames);
  TANDEM_CHECK_ARG(residual.sizes() == delta.sizes(),
                   "fused_add_layer_norm: residual of shape {} and delta of shape {}; the add "
                   "does not broadcast, pass delta of shape {}",
                   c10::str(residual.sizes()), c10::str(delta.sizes()),
                   c10::str(residual.sizes()));
  TANDEM_CHECK_ARG(residual.device() == delta.device(),
                   "fused_add_layer_norm: residual is on {} and delta on {}; move both to one "
                   "device",
                   residual.device().str(), delta.device().str());
  check_layer_norm_inputs(residual, weight, bias, add_layer_norm_options(residual, delta, options),
                          kAddLayerNormNames);
}

at::Tensor aten_layer_norm(const at::Tensor& input, const at::Tensor& weight,
                           const at::Tensor& bias, const FusedLayerNormOptions& options) {
  return at::layer_norm(input.to(at::kFloat), {input.size(-1)}, weight, bias, options.eps)
      .to(layer_norm_output_dtype(input, options));
}

#if TANDEM_CUDA_KERNELS_BUILT

bool affine_takes_kernel(const at::Tensor& param) {
  return !param.defined() || (param.scalar_type() == at::kFloat && param.is_contiguous());
}

// A defined fp32 tensor's data; null for an undefined one (none wanted).
float* float_data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

// gamma's and beta's gradients into result[weight_index] and the next,
// where wanted: column sums of dy * xhat and of dy over x's rows.
void affine_gradients(torch::autograd::AutogradContext* ctx, const at::Tensor& dy,
                      const at::Tensor& x, const at::Tensor& weight, const at::Tensor& mean,
                      const at::Tensor& rstd, std::size_t weight_index, const char* op,
                      torch::autograd::variable_list& result) {
  const bool want_weight = weight.defined() && ctx->needs_input_grad(weight_index);
  const bool want_bias =
      ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(weight_index + 1);
  if (!want_weight && !want_bias) return;
  const int64_t rows = x.size(0), columns = x.size(1);
  const int64_t partials = layer_norm_cuda::partial_rows(rows);
  const auto fp32 = x.options().dtype(at::kFloat);
  at::Tensor dgamma = want_weight ? at::empty({partials, columns}, fp32) : at::Tensor();
  at::Tensor dbeta = want_bias ? at::empty({partials, columns}, fp32) : at::Tensor();
  cuda_kernels::check_launch(
      layer_norm_cuda::launch_backward_affine(
          dy.data_ptr(), *cuda_kernels::kernel_value_type(dy.scalar_type()), x.data_ptr(),
          *cuda_kernels::kernel_value_type(x.scalar_type()), mean.data_ptr<float>(),
          rstd.data_ptr<float>(), rows, columns, float_data_or_null(dgamma),
          float_data_or_null(dbeta), at::cuda::getCurrentCUDAStream(x.device().index())),
      op, "backward (weight and bias)");
  if (want_weight) result[weight_index] = dgamma.sum(0);
  if (want_bias) result[weight_index + 1] = dbeta.sum(0);
}

// Saved for backward: the input (no copy), gamma, and each row's mean and
// 1 / std in fp32.
struct FusedLayerNormFunction : torch::autograd::Function<FusedLayerNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias, double eps,
                            int64_t output_dtype) {
    const c10::cuda::CUDAGuard guard(input.device());
    const int64_t rows = input.size(0), columns = input.size(1);
    const auto out_type = static_cast<at::ScalarType>(output_dtype);
    const auto fp32 = input.options().dtype(at::kFloat);
    at::Tensor output = at::empty({rows, columns}, input.options().dtype(out_type));
    at::Tensor mean = at::empty({rows}, fp32), rstd = at::empty({rows}, fp32);
    cuda_kernels::check_launch(
        layer_norm_cuda::launch_forward(
            input.data_ptr(), *cuda_kernels::kernel_value_type(input.scalar_type()),
            output.data_ptr(), *cuda_kernels::kernel_value_type(out_type),
            float_data_or_null(weight), float_data_or_null(bias), rows, columns,
            static_cast<float>(eps), mean.data_ptr<float>(), rstd.data_ptr<float>(),
            at::cuda::getCurrentCUDAStream(input.device().index())),
        "fused_layer_norm", "forward");
    ctx->save_for_backward({input, weight, mean, rstd});
    ctx->saved_data["has_bias"] = bias.defined();
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TANDEM_CHECK_ARG(!torch::GradMode::is_enabled(),
                     "fused_layer_norm has first derivatives only; for a double backward "
                     "(create_graph=true), use at::layer_norm");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    torch::autograd::variable_list result(5);
    if (!grads[0].defined()) return result;
    const c10::cuda::CUDAGuard guard(input.device());
    const at::Tensor dy = grads[0].contiguous();
    const int64_t rows = input.size(0), columns = input.size(1);
    const auto in_type = *cuda_kernels::kernel_value_type(input.scalar_type());
    const auto out_type = *cuda_kernels::kernel_value_type(dy.scalar_type());
    const auto stream = at::cuda::getCurrentCUDAStream(input.device().index());
    if (ctx->needs_input_grad(0)) {
      result[0] = at::empty_like(input);
      cuda_kernels::check_launch(
          layer_norm_cuda::launch_backward_input(
              dy.data_ptr(), out_type, input.data_ptr(), in_type, float_data_or_null(weight),
              mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, columns,
              /*add_grad=*/nullptr, result[0].data_ptr(), /*dx_out=*/nullptr, stream),
          "fused_layer_norm", "backward (input)");
    }
    affine_gradients(ctx, dy, input, weight, mean, rstd, /*weight_index=*/1, "fused_layer_norm",
                     result);
    return result;
  }
};

// forward(residual, delta, weight, bias, eps) -> {sum, normalized}, sum in
// the residual's dtype and normalized in delta's (uses_kernel's rule).
// Saved: sum (an output, no copy), gamma, mean and 1 / std. Gradients that
// never arrive stay undefined (materialize_grads off), so an unused sum
// costs no zero-filled tensor.
struct FusedAddLayerNormFunction : torch::autograd::Function<FusedAddLayerNormFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& residual,
                                                const at::Tensor& delta, const at::Tensor& weight,
                                                const at::Tensor& bias, double eps) {
    const c10::cuda::CUDAGuard guard(residual.device());
    const int64_t rows = residual.size(0), columns = residual.size(1);
    const auto fp32 = residual.options().dtype(at::kFloat);
    at::Tensor sum = at::empty_like(residual);
    at::Tensor output = at::empty_like(delta);
    at::Tensor mean = at::empty({rows}, fp32), rstd = at::empty({rows}, fp32);
    cuda_kernels::check_launch(
        layer_norm_cuda::launch_add_forward(
            residual.data_ptr(), *cuda_kernels::kernel_value_type(residual.scalar_type()),
            delta.data_ptr(), sum.data_ptr(), output.data_ptr(),
            *cuda_kernels::kernel_value_type(delta.scalar_type()), float_data_or_null(weight),
            float_data_or_null(bias), rows, columns, static_cast<float>(eps),
            mean.data_ptr<float>(), rstd.data_ptr<float>(),
            at::cuda::getCurrentCUDAStream(residual.device().index())),
        "fused_add_layer_norm", "forward");
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({sum, weight, mean, rstd});
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["delta_dtype"] = static_cast<int64_t>(delta.scalar_type());
    return {sum, output};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TANDEM_CHECK_ARG(!torch::GradMode::is_enabled(),
                     "fused_add_layer_norm has first derivatives only; for a double backward "
                     "(create_graph=true), use an add and at::layer_norm");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &sum = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const auto delta_dtype = static_cast<at::ScalarType>(ctx->saved_data["delta_dtype"].toInt());
    const at::Tensor& sum_grad = grads[0];
    torch::autograd::variable_list result(5);
    if (!grads[1].defined()) {  // only the sum was used: the add's own backward
      if (!sum_grad.defined()) return result;
      if (ctx->needs_input_grad(0)) result[0] = sum_grad;
      if (ctx->needs_input_grad(1)) result[1] = sum_grad.to(delta_dtype);
      return result;
    }
    const c10::cuda::CUDAGuard guard(sum.device());
    const at::Tensor dy = grads[1].contiguous();
    const at::Tensor add_grad = sum_grad.defined() ? sum_grad.contiguous() : at::Tensor();
    const int64_t rows = sum.size(0), columns = sum.size(1);
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      if (ctx->needs_input_grad(0)) result[0] = at::empty_like(sum);
      if (ctx->needs_input_grad(1)) result[1] = at::empty_like(dy);
      cuda_kernels::check_launch(
          layer_norm_cuda::launch_backward_input(
              dy.data_ptr(), *cuda_kernels::kernel_value_type(dy.scalar_type()), sum.data_ptr(),
              *cuda_kernels::kernel_value_type(sum.scalar_type()), float_data_or_null(weight),
              mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, columns,
              add_grad.defined() ? add_grad.data_ptr() : nullptr,
              result[0].defined() ? result[0].data_ptr() : nullptr,
              result[1].defined() ? result[1].data_ptr() : nullptr,
              at::cuda::getCurrentCUDAStream(sum.device().index())),
          "fused_add_layer_norm", "backward (residual and delta)");
    }
    affine_gradients(ctx, dy, sum, weight, mean, rstd, /*weight_index=*/2,
                     "fused_add_layer_norm", result);
    return result;
  }
};

#endif  // TANDEM_CUDA_KERNELS_BUILT

}  // namespace

bool fused_layer_norm_uses_kernel(const at::Tensor& input, const at::Tensor& weight,
                                  const at::Tensor& bias, const FusedLayerNormOptions& options) {
#if TANDEM_CUDA_KERNELS_BUILT
  if (!input.defined() || !input.is_cuda()) return false;
  const auto in = cuda_kernels::kernel_value_type(input.scalar_type());
  const auto out = cuda_kernels::kernel_value_type(layer_norm_output_dtype(input, options));
  return in && out && layer_norm_cuda::takes(*in, *out) && affine_takes_kernel(weight) &&
         affine_takes_kernel(bias);
#else
  (void)input, (void)weight, (void)bias, (void)options;
  return false;
#endif
}

at::Tensor fused_layer_norm(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const FusedLayerNormOptions& options) {
  check_layer_norm_inputs(input, weight, bias, options);
  if (!fused_layer_norm_uses_kernel(input, weight, bias, options)) {
    return aten_layer_norm(input, weight, bias, options);
  }
#if TANDEM_CUDA_KERNELS_BUILT
  const int64_t columns = input.size(-1);
  std::vector<int64_t> shape = input.sizes().vec();
  at::Tensor rows = input.reshape({-1, columns}).contiguous();
  at::Tensor output = FusedLayerNormFunction::apply(
      rows, weight, bias, options.eps,
      static_cast<int64_t>(layer_norm_output_dtype(input, options)));
  return output.view(shape);
#else
  return aten_layer_norm(input, weight, bias, options);
#endif
}

bool fused_add_layer_norm_uses_kernel(const at::Tensor& residual, const at::Tensor& delta,
                                      const at::Tensor& weight, const at::Tensor& bias,
                                      const FusedLayerNormOptions& options) {
  if (!residual.defined() || !delta.defined() || residual.device() != delta.device() ||
      residual.sizes() != delta.sizes()) {
    return false;
  }
  // The kernels read the residual and write the sum in one dtype, and
  // write the normalized rows in delta's.
  const auto sum_dtype = add_sum_dtype(residual, delta);
  const auto explicit_options = add_layer_norm_options(residual, delta, options);
  return sum_dtype == residual.scalar_type() &&
         explicit_options.output_dtype == delta.scalar_type() &&
         fused_layer_norm_uses_kernel(residual, weight, bias, explicit_options);
}

AddLayerNormOutput fused_add_layer_norm(const at::Tensor& residual, const at::Tensor& delta,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        const FusedLayerNormOptions& options) {
  check_add_layer_norm_inputs(residual, delta, weight, bias, options);
  const auto explicit_options = add_layer_norm_options(residual, delta, options);
#if TANDEM_CUDA_KERNELS_BUILT
  if (fused_add_layer_norm_uses_kernel(residual, delta, weight, bias, options)) {
    const int64_t columns = residual.size(-1);
    const auto outputs = FusedAddLayerNormFunction::apply(
        residual.reshape({-1, columns}).contiguous(), delta.reshape({-1, columns}).contiguous(),
        weight, bias, options.eps);
    return {outputs[0].view(residual.sizes()), outputs[1].view(residual.sizes())};
  }
#endif
  at::Tensor sum = residual + delta;
  return {sum, aten_layer_norm(sum, weight, bias, explicit_options)};
}

}  // namespace tandem
