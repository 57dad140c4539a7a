// fused_cross_entropy: tandem's CUDA kernels behind an autograd function
// where the build has them, LibTorch's fp32 cross-entropy elsewhere.

#include "tandem/amp/cross_entropy.h"

#include <string>

#include <c10/util/StringUtil.h>
#include <torch/autograd.h>
#include <torch/nn/functional/loss.h>

#include "amp/cuda_kernels_config.h"
#include "amp/kernel_value_type.h"
#include "tandem/core/error.h"

#if TANDEM_CUDA_KERNELS_BUILT
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "amp/cross_entropy_cuda.h"
#include "amp/kernel_launch.h"
#endif

namespace tandem {
namespace {

bool is_logits_dtype(at::ScalarType type) {
  return cuda_kernels::kernel_value_type(type).has_value();
}

void check_cross_entropy_inputs(const at::Tensor& logits, const at::Tensor& targets) {
  TANDEM_CHECK_ARG(logits.defined() && targets.defined(),
                   "fused_cross_entropy: logits and targets must both be defined tensors");
  TANDEM_CHECK_ARG(is_logits_dtype(logits.scalar_type()),
                   "fused_cross_entropy: logits are {}; pass float32, bfloat16 or float16 logits",
                   c10::toString(logits.scalar_type()));
  TANDEM_CHECK_ARG(logits.dim() >= 1 && logits.size(-1) > 0,
                   "fused_cross_entropy: logits of shape {} have no class dimension; pass "
                   "[..., classes] with classes > 0",
                   c10::str(logits.sizes()));
  TANDEM_CHECK_ARG(targets.scalar_type() == at::kLong,
                   "fused_cross_entropy: targets are {}; pass int64 class indices "
                   "(targets.to(torch::kLong))",
                   c10::toString(targets.scalar_type()));
  TANDEM_CHECK_ARG(targets.sizes() == logits.sizes().slice(0, logits.dim() - 1),
                   "fused_cross_entropy: targets of shape {} do not match logits of shape {}; "
                   "targets need the logits' shape without its last (class) dimension",
                   c10::str(targets.sizes()), c10::str(logits.sizes()));
  TANDEM_CHECK_ARG(targets.device() == logits.device(),
                   "fused_cross_entropy: logits are on {} and targets on {}; move both to one "
                   "device",
                   logits.device().str(), targets.device().str());
}

at::Tensor aten_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                              const CrossEntropyOptions& options) {
  namespace F = torch::nn::functional;
  auto aten_options = F::CrossEntropyFuncOptions().ignore_index(options.ignore_index);
  switch (options.reduction) {
    case CrossEntropyReduction::kMean: aten_options.reduction(torch::kMean); break;
    case CrossEntropyReduction::kSum: aten_options.reduction(torch::kSum); break;
    case CrossEntropyReduction::kNone: aten_options.reduction(torch::kNone); break;
  }
  at::Tensor loss = F::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                     targets.reshape({-1}), aten_options);
  return options.reduction == CrossEntropyReduction::kNone ? loss.view(targets.sizes()) : loss;
}

#if TANDEM_CUDA_KERNELS_BUILT

// Saved for backward: the logits as given (no fp32 copy), the targets, one
// fp32 log-sum-exp per row and, for a mean, the count of non-ignored
// targets. Returns the [rows] losses unreduced, or their sum or mean.
struct FusedCrossEntropyFunction : torch::autograd::Function<FusedCrossEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t ignore_index, int64_t reduction) {
    const c10::cuda::CUDAGuard guard(logits.device());
    const int64_t rows = logits.size(0), classes = logits.size(1);
    const auto fp32 = logits.options().dtype(at::kFloat);
    at::Tensor row_loss = at::empty({rows}, fp32);
    at::Tensor lse = at::empty({rows}, fp32);
    const cudaError_t launched = cross_entropy_cuda::launch_forward(
        logits.data_ptr(), *cuda_kernels::kernel_value_type(logits.scalar_type()),
        targets.data_ptr<int64_t>(), rows, classes, ignore_index, row_loss.data_ptr<float>(),
        lse.data_ptr<float>(), at::cuda::getCurrentCUDAStream(logits.device().index()));
    cuda_kernels::check_launch(launched, "fused_cross_entropy", "forward");
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["reduction"] = reduction;
    switch (static_cast<CrossEntropyReduction>(reduction)) {
      case CrossEntropyReduction::kMean: {
        at::Tensor count = targets.ne(ignore_index).sum().to(at::kFloat);
        ctx->save_for_backward({logits, targets, lse, count});
        return row_loss.sum() / count;
      }
      case CrossEntropyReduction::kSum:
        ctx->save_for_backward({logits, targets, lse});
        return row_loss.sum();
      case CrossEntropyReduction::kNone:
        break;
    }
    ctx->save_for_backward({logits, targets, lse});
    return row_loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    TANDEM_CHECK_ARG(!torch::GradMode::is_enabled(),
                     "fused_cross_entropy has first derivatives only; for a double backward "
                     "(create_graph=true), use torch::nn::functional::cross_entropy");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const c10::cuda::CUDAGuard guard(logits.device());
    const auto reduction = static_cast<CrossEntropyReduction>(ctx->saved_data["reduction"].toInt());
    // One factor for the whole tensor (the upstream gradient, over the count
    // for a mean), or, unreduced, one per row.
    at::Tensor scale = grads[0].to(at::kFloat);
    if (reduction == CrossEntropyReduction::kMean) scale = scale / saved[3];
    scale = scale.contiguous();
    const int64_t scale_stride = reduction == CrossEntropyReduction::kNone ? 1 : 0;
    at::Tensor grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
    const cudaError_t launched = cross_entropy_cuda::launch_backward(
        logits.data_ptr(), *cuda_kernels::kernel_value_type(logits.scalar_type()),
        saved[1].data_ptr<int64_t>(), saved[2].data_ptr<float>(), scale.data_ptr<float>(),
        scale_stride, logits.size(0), logits.size(1), ctx->saved_data["ignore_index"].toInt(),
        grad.data_ptr(), at::cuda::getCurrentCUDAStream(logits.device().index()));
    cuda_kernels::check_launch(launched, "fused_cross_entropy", "backward");
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

#endif  // TANDEM_CUDA_KERNELS_BUILT

}  // namespace

bool built_with_cuda_kernels() {
#if TANDEM_CUDA_KERNELS_BUILT
  return true;
#else
  return false;
#endif
}

bool fused_cross_entropy_uses_kernel(const at::Tensor& logits) {
  return built_with_cuda_kernels() && logits.defined() && logits.is_cuda() &&
         is_logits_dtype(logits.scalar_type());
}

at::Tensor fused_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                               const CrossEntropyOptions& options) {
  check_cross_entropy_inputs(logits, targets);
  if (!fused_cross_entropy_uses_kernel(logits)) {
    return aten_cross_entropy(logits, targets, options);
  }
#if TANDEM_CUDA_KERNELS_BUILT
  const int64_t classes = logits.size(-1);
  const at::Tensor rows = logits.reshape({-1, classes}).contiguous();
  TANDEM_CHECK_ARG(rows.size(0) <= INT32_MAX,
                   "fused_cross_entropy: {} rows of logits; the kernel takes at most 2^31 - 1",
                   rows.size(0));
  at::Tensor loss = FusedCrossEntropyFunction::apply(rows, targets.reshape({-1}).contiguous(),
                                                     options.ignore_index,
                                                     static_cast<int64_t>(options.reduction));
  return options.reduction == CrossEntropyReduction::kNone ? loss.view(targets.sizes()) : loss;
#else
  return aten_cross_entropy(logits, targets, options);
#endif
}

}  // namespace tandem
