// unscale_and_find_inf(): validation, CPU threading and the CUDA path.

#include "tandem/amp/unscale.h"

#include <atomic>
#include <map>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "amp/unscale_kernels.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

bool supported_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
         dtype == at::kBFloat16;
}

void check_tensor(const at::Tensor& t, size_t index) {
  TANDEM_CHECK_ARG(t.layout() == at::kStrided,
                   "unscale_and_find_inf: tensor {} is not a dense (strided) tensor; pass "
                   "dense gradients",
                   index);
  TANDEM_CHECK_ARG(supported_dtype(t.scalar_type()),
                   "unscale_and_find_inf: tensor {} has dtype {}; gradients must be float32, "
                   "float64, float16 or bfloat16",
                   index, c10::toString(t.scalar_type()));
  TANDEM_CHECK_ARG(t.is_cpu() || t.is_cuda(),
                   "unscale_and_find_inf: tensor {} is on {}; only CPU and CUDA tensors are "
                   "supported",
                   index, t.device().str());
}

template <typename T, typename S>
bool unscale_contiguous(T* data, int64_t n, S s, int64_t grain) {
  std::atomic<bool> found{false};
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    if (detail::unscale_span(data + begin, end - begin, s)) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load(std::memory_order_relaxed);
}

bool unscale_cpu(const at::Tensor& tensor, double inv_scale, int64_t grain) {
  at::Tensor t = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const int64_t n = t.numel();
  // inv_scale is rounded to the compute type first, as t.mul_(inv_scale)
  // and torch's unscale kernel (a float32 inv_scale tensor) both do.
  const auto s = static_cast<float>(inv_scale);
  bool found = false;
  switch (t.scalar_type()) {
    case at::kFloat: found = unscale_contiguous(t.data_ptr<float>(), n, s, grain); break;
    case at::kDouble: found = unscale_contiguous(t.data_ptr<double>(), n, inv_scale, grain); break;
    case at::kHalf: found = unscale_contiguous(t.data_ptr<at::Half>(), n, s, grain); break;
    case at::kBFloat16:
      found = unscale_contiguous(t.data_ptr<at::BFloat16>(), n, s, grain);
      break;
    default: break;  // rejected by check_tensor()
  }
  if (!t.is_same(tensor)) tensor.copy_(t);
  return found;
}

// One fused launch per device, the flags read back after all are queued so
// that the host waits once.
bool unscale_cuda(const std::vector<at::Tensor>& tensors, double inv_scale) {
  std::map<c10::DeviceIndex, std::vector<at::Tensor>> by_device;
  for (const auto& t : tensors) by_device[t.device().index()].push_back(t);
  std::vector<at::Tensor> flags;
  for (auto& entry : by_device) {
    auto options = at::TensorOptions().dtype(at::kFloat).device(entry.second.front().device());
    at::Tensor found_inf = at::zeros({1}, options);
    at::Tensor inv = at::full({1}, inv_scale, options);
    at::_amp_foreach_non_finite_check_and_unscale_(entry.second, found_inf, inv);
    flags.push_back(found_inf);
  }
  bool found = false;
  for (const auto& flag : flags) found = found || flag.item<float>() > 0;
  return found;
}

}  // namespace

bool unscale_and_find_inf(at::TensorList tensors, double inv_scale,
                          const UnscaleOptions& options) {
  TANDEM_CHECK_ARG(options.grain_size >= 1, "UnscaleOptions::grain_size is {}; it must be >= 1",
                   options.grain_size);
  std::vector<at::Tensor> cuda;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined()) check_tensor(tensors[i], i);
  }
  // A tensor listed twice (a tied weight's gradient) is unscaled once.
  std::unordered_set<const c10::TensorImpl*> seen;
  bool found = false;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    if (t.is_cuda()) {
      cuda.push_back(t);
    } else {
      found = unscale_cpu(t, inv_scale, options.grain_size) || found;
    }
  }
  if (!cuda.empty()) found = unscale_cuda(cuda, inv_scale) || found;
  return found;
}

}  // namespace tandem
