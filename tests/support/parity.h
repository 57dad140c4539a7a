#pragma once
// The two helpers every parity test compares models with: a snapshot of the
// parameters by name, and the largest relative difference between two.
//
// Tolerance policy (what a test asserts, and why):
//   * torch::equal (bit for bit) where the claim is that nothing changed the
//     arithmetic: exact resume, zero::Init against the materialised model,
//     frozen parameters, the same run twice.
//   * max_relative_diff <= 1e-5 where the same fp32 arithmetic runs in
//     another order or split: DDP or ZeRO at N ranks against one rank on the
//     concatenated batch, ZeRO against DDP, offload against none. Observed
//     differences are 1e-7 to 4e-6.
//   * Anything looser (1e-4 and up: bf16, fp16, an optimizer implemented
//     differently) says why at the assertion.

#include <algorithm>
#include <map>
#include <string>

#include <torch/torch.h>

namespace tandem::testing {

using Params = std::map<std::string, torch::Tensor>;

// Every parameter by registered name (a tied tensor under each of its
// names), and with `with_buffers` every buffer too: detached copies on the
// CPU, in their own dtype.
inline Params snapshot(const torch::nn::Module& model, bool with_buffers = false) {
  Params out;
  for (const auto& item : model.named_parameters()) {
    out[item.key()] = item.value().detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  }
  if (with_buffers) {
    for (const auto& item : model.named_buffers()) {
      out[item.key()] =
          item.value().detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  return out;
}

// The largest difference between `a` and `b` over the entries of `b`,
// computed in double: |a - b| / |b| where |b| > 1e-3, and |a - b| where
// |b| <= 1e-3 (a relative error means nothing near zero). Throws
// std::out_of_range when `a` lacks one of `b`'s names.
inline double max_relative_diff(const Params& a, const Params& b) {
  double worst = 0;
  for (const auto& [name, ref_any] : b) {
    const torch::Tensor ref = ref_any.to(torch::kCPU, torch::kDouble);
    const torch::Tensor got = a.at(name).to(torch::kCPU, torch::kDouble);
    const torch::Tensor diff = (got - ref).abs();
    if (diff.numel() == 0) continue;
    const torch::Tensor err = torch::where(ref.abs() > 1e-3, diff / ref.abs(), diff);
    worst = std::max(worst, err.max().item<double>());
  }
  return worst;
}

inline double max_relative_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  return max_relative_diff(snapshot(a), snapshot(b));
}

}  // namespace tandem::testing
