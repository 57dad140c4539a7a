#pragma once
// Vectorised, multithreaded Adam and AdamW for float32 on the CPU: the
// optimizer step of ZeRO with CPU offload, and a drop-in replacement for
// torch::optim::Adam / AdamW on CPU models.
//
//   tandem::CpuAdam optimizer(model->parameters(), torch::optim::AdamWOptions(3e-4));
//   for (...) { ...; loss.backward(); optimizer.step(); optimizer.zero_grad(); }
//
// One fused pass reads param, grad, exp_avg and exp_avg_sq once and writes
// param, exp_avg and exp_avg_sq once (28 bytes per element), with AVX-512,
// AVX2+FMA or scalar code picked at run time for this CPU. Every element goes
// through the same operations, in the same order, as LibTorch's
// torch::optim::Adam / AdamW step on AVX2 (including the fused multiply-adds
// its kernels use). Results match PyTorch 2.13's pip LibTorch within float32
// tolerance, not bitwise, because its MKL sqrt is not correctly rounded
// (Debian's LibTorch 1.13, which tandem built against before, matched to the
// last bit), and they are bitwise identical whatever the thread count or ISA.

#include <cstdint>
#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

namespace tandem {

// The scalars of one Adam/AdamW step. Defaults are torch::optim::AdamOptions'.
struct AdamHyperparams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // false: Adam (L2, grad += weight_decay * param); true: AdamW (decoupled,
  // param *= 1 - lr * weight_decay before the update).
  bool decoupled_weight_decay = false;
};

// One Adam/AdamW step over n float32 elements, in place: updates param,
// exp_avg and exp_avg_sq from grad. `step` is the 1-based count of this update
// (for the bias corrections); start exp_avg and exp_avg_sq at zero.
//
// threads <= 0 means at::get_num_threads(). The call runs on at most
// `threads` OpenMP threads, fewer when n is small (each thread gets at least
// 4096 elements), and only on the calling thread when called from inside an
// OpenMP parallel region (ATen's at::parallel_for included). The result does
// not depend on the thread count, nor on the ISA.
//
// Throws UsageError, before touching any memory, for n < 0, step < 1, a null
// pointer with n > 0, or hyperparameters torch would refuse (lr, eps or
// weight_decay < 0, betas outside [0, 1)). The four arrays must not overlap.
// Thread-safe: concurrent calls on disjoint arrays are fine.
void cpu_adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                   int64_t step, const AdamHyperparams& h, int threads = 0);

// The code path cpu_adam_step() takes on this CPU: "avx512", "avx2" or
// "scalar" (or the one a test forced). Thread-safe.
const char* cpu_adam_isa();

// torch::optim::Adam / AdamW for CPU float32 contiguous parameters, stepping
// each parameter with cpu_adam_step(). Same options, same per-parameter state
// (step, exp_avg, exp_avg_sq, keyed like torch's) and the same save()/load()
// archive format as the torch optimizer it replaces, so a checkpoint moves
// between the two. Param groups keep the options type they were built with
// (AdamOptions or AdamWOptions), so LR schedulers and tandem's OneCycle see
// the usual types.
//
// step() throws UsageError (naming the group and parameter) for a parameter
// that is not a CPU float32 contiguous tensor, for a sparse gradient, and
// for amsgrad, which this optimizer does not implement; the constructor
// refuses amsgrad and the hyperparameters torch refuses. Parameters without
// a gradient are skipped. step() bumps each updated parameter's version
// counter, as torch's in-place update does.
//
// Thread-safety: none, like torch's optimizers; step() itself uses up to
// `threads` threads (0: at::get_num_threads() at each step).
class CpuAdam : public torch::optim::Optimizer {
 public:
  explicit CpuAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   torch::optim::AdamOptions defaults = {}, int threads = 0);
  explicit CpuAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults = {},
                   int threads = 0);
  CpuAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
          torch::optim::AdamWOptions defaults, int threads = 0);
  CpuAdam(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults,
          int threads = 0);

  // One step over every parameter with a gradient. `closure`, when given, is
  // called first with gradients enabled and its loss returned, as in torch.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // torch::optim::Adam's (or AdamW's) archive format.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // true when built from AdamWOptions.
  bool decoupled_weight_decay() const { return decoupled_; }

 private:
  bool decoupled_;
  int threads_;
};

namespace detail {

// Test seam: forces cpu_adam_step() onto "avx512", "avx2" or "scalar", or
// back to the automatic choice with nullptr. Throws UsageError for an unknown
// name or an ISA this CPU lacks. Not thread-safe with concurrent steps.
void set_cpu_adam_isa_for_testing(const char* isa);

// Whether this CPU (and OS) can run the given path ("scalar" always can).
bool cpu_adam_isa_supported(const char* isa);

}  // namespace detail
}  // namespace tandem
