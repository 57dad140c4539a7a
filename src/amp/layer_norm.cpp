// fused_layer_norm: tandem's CUDA kernels behind an autograd function where
// the build has them, LibTorch's fp32 layer_norm and a cast elsewhere.

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

void check_layer_norm_affine(const at::Tensor& param, const char* what, int64_t columns,
                             const at::Tensor& input) {
  if (!param.defined()) return;
  TANDEM_CHECK_ARG(param.dim() == 1 && param.size(0) == columns,
                   "fused_layer_norm: {} of shape {} for rows of {}; pass [{}] (or an undefined "
                   "tensor for none)",
                   what, c10::str(param.sizes()), columns, columns);
  TANDEM_CHECK_ARG(param.device() == input.device(),
                   "fused_layer_norm: {} is on {} and the input on {}; move both to one device",
                   what, param.device().str(), input.device().str());
}

void check_layer_norm_inputs(const at::Tensor& input, const at::Tensor& weight,
                             const at::Tensor& bias, const FusedLayerNormOptions& options) {
  TANDEM_CHECK_ARG(input.defined(), "fused_layer_norm: the input is an undefined tensor");
  TANDEM_CHECK_ARG(cuda_kernels::kernel_value_type(input.scalar_type()).has_value(),
                   "fused_layer_norm: the input is {}; pass float32, bfloat16 or float16",
                   c10::toString(input.scalar_type()));
  TANDEM_CHECK_ARG(
      cuda_kernels::kernel_value_type(layer_norm_output_dtype(input, options)).has_value(),
      "fused_layer_norm: output_dtype {}; choose float32, bfloat16 or float16",
      c10::toString(layer_norm_output_dtype(input, options)));
  TANDEM_CHECK_ARG(input.dim() >= 1 && input.size(-1) > 0,
                   "fused_layer_norm: an input of shape {} has no dimension to normalise",
                   c10::str(input.sizes()));
  TANDEM_CHECK_ARG(options.eps >= 0, "fused_layer_norm: eps is {}; it must be >= 0", options.eps);
  check_layer_norm_affine(weight, "weight", input.size(-1), input);
  check_layer_norm_affine(bias, "bias", input.size(-1), input);
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
              result[0].data_ptr(), stream),
          "fused_layer_norm", "backward (input)");
    }
    const bool want_weight = weight.defined() && ctx->needs_input_grad(1);
    const bool want_bias = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2);
    if (want_weight || want_bias) {
      const int64_t partials = layer_norm_cuda::partial_rows(rows);
      const auto fp32 = input.options().dtype(at::kFloat);
      at::Tensor dgamma = want_weight ? at::empty({partials, columns}, fp32) : at::Tensor();
      at::Tensor dbeta = want_bias ? at::empty({partials, columns}, fp32) : at::Tensor();
      cuda_kernels::check_launch(
          layer_norm_cuda::launch_backward_affine(
              dy.data_ptr(), out_type, input.data_ptr(), in_type, mean.data_ptr<float>(),
              rstd.data_ptr<float>(), rows, columns, float_data_or_null(dgamma),
              float_data_or_null(dbeta), stream),
          "fused_layer_norm", "backward (weight and bias)");
      if (want_weight) result[1] = dgamma.sum(0);
      if (want_bias) result[2] = dbeta.sum(0);
    }
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

}  // namespace tandem
