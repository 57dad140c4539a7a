#pragma once
// SyncBatchNorm: batch normalisation over the batch of every rank together,
// the LibTorch counterpart of torch.nn.SyncBatchNorm.
//
// In training mode each forward all-reduces per-channel [sum | sum of squares
// | count] once, normalises with the mean and (biased) variance of the
// concatenated batch, and updates the running statistics with the unbiased
// variance, so N ranks with local batch b compute what one process computes
// for the batch N*b. Local batch sizes may differ between ranks. Backward
// all-reduces sum(dy) and sum(dy * (x - mean)) once for grad_input; the
// gradients of weight and bias stay LOCAL sums, which DDP then averages
// (exactly as PyTorch). Eval mode uses the running statistics and
// communicates nothing.
//
// Two ways to get SyncBatchNorm into a model:
//
//  1. Declare it directly. With a null process group it IS BatchNorm (same
//     ATen kernel), so a model can always be written with it:
//       struct Block : torch::nn::Module {
//         tandem::SyncBatchNorm bn{tandem::SyncBatchNormOptions(64)};
//       };
//     and later convert_sync_batchnorm(model, pg) (or set_process_group)
//     attaches the group.
//
//  2. convert_sync_batchnorm(model, pg) on a model built from
//     torch::nn::BatchNorm1d/2d/3d. It rewrites the module tree, which is
//     all that PyTorch's version needs; in C++ a forward() often calls a
//     member field instead (`bn1_->forward(x)`), and no function can re-point
//     that field. See convert_sync_batchnorm for what is converted and the
//     error raised where it cannot be.
//
// Thread-safety: like any torch::nn::Module, one thread at a time. Every
// rank of the group must run the same SyncBatchNorm forwards (and the
// backwards through them) in the same order, like any collective.

#include <memory>
#include <ostream>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include "tandem/comm/process_group.h"

namespace tandem {

// num_features, eps, momentum (c10::nullopt: cumulative average, as in
// PyTorch), affine, track_running_stats: the same options as BatchNorm.
using SyncBatchNormOptions = torch::nn::BatchNormOptions;

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // Fresh parameters (weight 1, bias 0) and statistics (mean 0, var 1).
  // `process_group` may be null: the module is then plain BatchNorm.
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options,
                             std::shared_ptr<ProcessGroup> process_group = nullptr);

  // A SyncBatchNorm with `batch_norm`'s options that shares (does not copy)
  // its weight, bias and buffers, so an optimizer already holding those
  // parameters keeps training the new module; this is what PyTorch's
  // convert_sync_batchnorm does. Throws UsageError unless `batch_norm` is a
  // torch::nn::BatchNorm1d/2d/3d.
  static std::shared_ptr<SyncBatchNormImpl> from_batch_norm(
      torch::nn::Module& batch_norm, std::shared_ptr<ProcessGroup> process_group);

  // Registers weight, bias, running_mean, running_var and num_batches_tracked
  // under torch::nn::BatchNorm's names, so state dicts and checkpoints are
  // interchangeable with it. Called by the constructor and by clone().
  void reset() override;
  // Running mean 0, running var 1, num_batches_tracked 0.
  void reset_running_stats();
  // reset_running_stats(), weight 1, bias 0.
  void reset_parameters();

  // input: (N, C, *) with C = num_features, any rank >= 2 (BatchNorm1d/2d/3d
  // inputs alike). Training with a group of world size > 1: collective (see
  // the file comment); otherwise exactly torch::nn::BatchNorm's forward.
  // Throws UsageError on a bad shape or when the whole world holds a single
  // value per channel.
  at::Tensor forward(const at::Tensor& input);

  void pretty_print(std::ostream& stream) const override;

  // The group statistics are synchronised over; null means none.
  const std::shared_ptr<ProcessGroup>& process_group() const { return process_group_; }
  // Replaces the group; takes effect at the next forward. Not while a
  // backward through this module is pending on another thread.
  void set_process_group(std::shared_ptr<ProcessGroup> process_group);

  // Public like torch::nn::BatchNorm's fields, so user code reads the same.
  SyncBatchNormOptions options;
  at::Tensor weight;               // undefined unless options.affine()
  at::Tensor bias;                 // undefined unless options.affine()
  at::Tensor running_mean;         // undefined unless options.track_running_stats()
  at::Tensor running_var;          // undefined unless options.track_running_stats()
  at::Tensor num_batches_tracked;  // undefined unless options.track_running_stats()

 private:
  struct SkipReset {};
  // For from_batch_norm: registers nothing, so the adopted tensors can be.
  SyncBatchNormImpl(SkipReset, const SyncBatchNormOptions& options,
                    std::shared_ptr<ProcessGroup> process_group);
  // Registers the five tensors (undefined ones too, as BatchNorm does); a
  // parameter keeps its own requires_grad flag.
  void register_state(at::Tensor new_weight, at::Tensor new_bias, at::Tensor new_running_mean,
                      at::Tensor new_running_var, at::Tensor new_num_batches_tracked);
  // Bumps num_batches_tracked in training and returns the running-statistics
  // update factor, exactly as torch::nn::BatchNorm does.
  double next_average_factor();

  std::shared_ptr<ProcessGroup> process_group_;
};

TORCH_MODULE(SyncBatchNorm);

// True when `module` is a torch::nn::BatchNorm1d, BatchNorm2d or BatchNorm3d.
bool is_batch_norm(const torch::nn::Module& module);

// Makes every torch::nn::BatchNorm1d/2d/3d in `module`'s tree a SyncBatchNorm
// over `process_group` (via SyncBatchNormImpl::from_batch_norm: same options,
// shared parameters and buffers), and gives `process_group` to every
// SyncBatchNorm in the tree that has none. Returns the root: `module` itself,
// or a new SyncBatchNorm when `module` is a BatchNorm.
//
// What is converted, at any depth:
//  - children of torch::nn::Sequential, ModuleList and ModuleDict. These keep
//    their own list of modules besides the registry, and forward()/iteration
//    read that list, so Module::replace_module alone would change nothing
//    they run. They are rebuilt in place instead: the container object stays
//    the same, so holders to it (e.g. a `torch::nn::Sequential features_`
//    member) see the new modules.
//  - children of any other module that the module reaches only through its
//    registry (named_children(), named_modules()); they are swapped with
//    Module::replace_module. A forward that casts such a child to
//    torch::nn::BatchNorm2d must cast to tandem::SyncBatchNorm instead.
// What cannot be converted: a BatchNorm that something outside the module
// tree also holds, typically a member field (`torch::nn::BatchNorm2d bn1_`)
// that forward() calls. replace_module re-points the registry, not the
// field, so forward would keep running the old, unsynchronised BatchNorm
// while the optimizer saw the new module. convert_sync_batchnorm detects
// these (a reference count above what the tree accounts for) before changing
// anything and throws UsageError naming them; declare such fields as
// tandem::SyncBatchNorm instead (see the file comment).
//
// Call it before wrapping the model in DistributedDataParallel. Not
// thread-safe with other uses of the module.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::Module> module, std::shared_ptr<ProcessGroup> process_group);

// Holder overload (torch::nn::Sequential, a TORCH_MODULE type, ...). The
// holder still points at the root afterwards unless the root itself was a
// BatchNorm; use the return value then.
template <typename ModuleImpl>
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const torch::nn::ModuleHolder<ModuleImpl>& module,
    std::shared_ptr<ProcessGroup> process_group) {
  return convert_sync_batchnorm(std::static_pointer_cast<torch::nn::Module>(module.ptr()),
                                std::move(process_group));
}

}  // namespace tandem
