#include "tandem/parallel/sync_batch_norm.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include "parallel/sync_batch_norm_function.h"
#include "tandem/core/error.h"

namespace tandem {
namespace {

using torch::nn::Module;

// The state of a torch::nn::BatchNorm{1,2,3}d, whichever dimension it is.
struct BatchNormView {
  SyncBatchNormOptions options{0};
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

template <typename BatchNormImpl>
bool view_as(Module& module, BatchNormView& view) {
  auto* bn = dynamic_cast<BatchNormImpl*>(&module);
  if (bn == nullptr) return false;
  view = {bn->options, bn->weight, bn->bias, bn->running_mean, bn->running_var,
          bn->num_batches_tracked};
  return true;
}

bool view_batch_norm(Module& module, BatchNormView& view) {
  return view_as<torch::nn::BatchNorm1dImpl>(module, view) ||
         view_as<torch::nn::BatchNorm2dImpl>(module, view) ||
         view_as<torch::nn::BatchNorm3dImpl>(module, view);
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& init_options,
                                     std::shared_ptr<ProcessGroup> process_group)
    : SyncBatchNormImpl(SkipReset{}, init_options, std::move(process_group)) {
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(SkipReset, const SyncBatchNormOptions& init_options,
                                     std::shared_ptr<ProcessGroup> process_group)
    : Cloneable("tandem::SyncBatchNorm"),
      options(init_options),
      process_group_(std::move(process_group)) {}

std::shared_ptr<SyncBatchNormImpl> SyncBatchNormImpl::from_batch_norm(
    Module& batch_norm, std::shared_ptr<ProcessGroup> process_group) {
  BatchNormView view;
  TANDEM_CHECK_ARG(view_batch_norm(batch_norm, view),
                   "SyncBatchNorm::from_batch_norm needs a torch::nn::BatchNorm1d, 2d or 3d, "
                   "got {}",
                   batch_norm.name());
  std::shared_ptr<SyncBatchNormImpl> sync_bn(
      new SyncBatchNormImpl(SkipReset{}, view.options, std::move(process_group)));
  sync_bn->register_state(view.weight, view.bias, view.running_mean, view.running_var,
                          view.num_batches_tracked);
  sync_bn->train(batch_norm.is_training());
  return sync_bn;
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  at::Tensor new_weight, new_bias, new_running_mean, new_running_var, new_num_batches_tracked;
  if (options.affine()) {
    new_weight = torch::ones({c}, torch::requires_grad());
    new_bias = torch::zeros({c}, torch::requires_grad());
  }
  if (options.track_running_stats()) {
    new_running_mean = torch::zeros({c});
    new_running_var = torch::ones({c});
    new_num_batches_tracked = torch::tensor(0, torch::dtype(torch::kLong));
  }
  register_state(new_weight, new_bias, new_running_mean, new_running_var,
                 new_num_batches_tracked);
}

void SyncBatchNormImpl::register_state(at::Tensor new_weight, at::Tensor new_bias,
                                       at::Tensor new_running_mean, at::Tensor new_running_var,
                                       at::Tensor new_num_batches_tracked) {
  const bool weight_grad = new_weight.defined() && new_weight.requires_grad();
  const bool bias_grad = new_bias.defined() && new_bias.requires_grad();
  weight = register_parameter("weight", std::move(new_weight), weight_grad);
  bias = register_parameter("bias", std::move(new_bias), bias_grad);
  running_mean = register_buffer("running_mean", std::move(new_running_mean));
  running_var = register_buffer("running_var", std::move(new_running_var));
  num_batches_tracked = register_buffer("num_batches_tracked", std::move(new_num_batches_tracked));
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  at::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (!options.affine()) return;
  at::NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

void SyncBatchNormImpl::set_process_group(std::shared_ptr<ProcessGroup> process_group) {
  process_group_ = std::move(process_group);
}

double SyncBatchNormImpl::next_average_factor() {
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    at::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    // No momentum: cumulative average over every batch seen so far.
    if (!options.momentum().has_value()) {
      factor = 1.0 / num_batches_tracked.item<double>();
    }
  }
  return factor;
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  TANDEM_CHECK_ARG(input.dim() >= 2,
                   "SyncBatchNorm expects an input of shape (N, C, *) with at least 2 "
                   "dimensions, got shape {}",
                   c10::str(input.sizes()));
  TANDEM_CHECK_ARG(input.size(1) == options.num_features(),
                   "SyncBatchNorm({}) got an input of shape {} whose dimension 1 (channels) is "
                   "{}; it must equal num_features",
                   options.num_features(), c10::str(input.sizes()), input.size(1));
  const double factor = next_average_factor();
  // As in PyTorch, only training synchronises; eval without running
  // statistics normalises each rank's batch on its own.
  const bool synchronise = is_training() && process_group_ && process_group_->world_size() > 1;
  if (!synchronise) {
    const bool batch_statistics = is_training() || !options.track_running_stats();
    // torch.nn.functional.batch_norm's check (at::batch_norm has none): one
    // value per channel has no variance, and would come out as the bias.
    TANDEM_CHECK_ARG(!batch_statistics || input.numel() / input.size(1) != 1,
                     "SyncBatchNorm expected more than 1 value per channel when training, got "
                     "input of shape {}{}. Use a larger batch or call eval()",
                     c10::str(input.sizes()),
                     is_training() ? "" : " (track_running_stats is false, so eval() uses the "
                                          "batch's statistics too)");
    return at::batch_norm(input, weight, bias, running_mean, running_var, batch_statistics,
                          factor, options.eps(), at::globalContext().userEnabledCuDNN());
  }

  detail::GlobalBatchStats stats;
  {
    // The statistics' dependence on the input is part of the custom backward.
    at::NoGradGuard no_grad;
    stats = detail::all_reduce_batch_stats(input, *process_group_);
    // Every rank sees the same global count, so all of them throw or none.
    TANDEM_CHECK_ARG(stats.count > 1,
                     "SyncBatchNorm expected more than 1 value per channel when training, got "
                     "{} over all {} ranks (this rank's input has shape {}). Use a larger "
                     "batch or call eval().",
                     stats.count, process_group_->world_size(), c10::str(input.sizes()));
    if (running_mean.defined()) {
      // Running variance is unbiased over the global batch, as in ATen.
      const double n = static_cast<double>(stats.count);
      running_mean.mul_(1.0 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
      running_var.mul_(1.0 - factor)
          .add_(stats.var.to(running_var.scalar_type()).mul(n / (n - 1.0)), factor);
    }
  }
  return detail::sync_batch_norm(input, weight, bias, stats, options.eps(), process_group_);
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "tandem::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats()
         << ", world_size=" << (process_group_ ? process_group_->world_size() : 1) << ")";
}

bool is_batch_norm(const Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&module) != nullptr;
}

// ---------------------------------------------------------------------------
// convert_sync_batchnorm: plan the whole conversion, check it, then apply it,
// so that a model that cannot be converted is left untouched.

namespace {

// A BatchNorm registered as child `name` of `parent`.
struct BatchNormSite {
  std::shared_ptr<Module> parent;
  std::string name;
  std::string path;  // dotted path from the root, for messages
  std::shared_ptr<Module> batch_norm;
};

struct ConversionPlan {
  std::vector<BatchNormSite> sites;
  std::vector<SyncBatchNormImpl*> without_group;
};

using Replacements = std::unordered_map<const Module*, std::shared_ptr<SyncBatchNormImpl>>;

// Containers whose forward()/iteration reads a module list of their own,
// which Module::replace_module does not touch.
bool keeps_own_module_list(const Module& module) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&module) != nullptr;
}

void collect(const std::shared_ptr<Module>& parent, const std::string& path,
             std::unordered_set<const Module*>& visited, ConversionPlan& plan) {
  if (!visited.insert(parent.get()).second) return;  // a shared submodule: plan it once
  for (const auto& item : parent->named_children()) {
    const std::string child_path = path.empty() ? item.key() : path + "." + item.key();
    const auto& child = item.value();
    if (is_batch_norm(*child)) {
      plan.sites.push_back({parent, item.key(), child_path, child});
    } else if (auto* sync_bn = dynamic_cast<SyncBatchNormImpl*>(child.get())) {
      if (!sync_bn->process_group()) plan.without_group.push_back(sync_bn);
    } else {
      collect(child, child_path, visited, plan);
    }
  }
}

// Each site accounts for three references: the parent's registry, the
// container's own list (Sequential, ModuleList, ModuleDict only) and
// site.batch_norm. Anything above that is held outside the tree.
void check_no_outside_holders(const ConversionPlan& plan) {
  std::unordered_map<const Module*, long> expected;
  for (const auto& site : plan.sites) {
    expected[site.batch_norm.get()] += 2 + (keeps_own_module_list(*site.parent) ? 1 : 0);
  }
  std::string held;
  for (const auto& site : plan.sites) {
    const long extra = site.batch_norm.use_count() - expected[site.batch_norm.get()];
    if (extra <= 0) continue;
    held += fmt::format("{}{} ({}, {} extra reference{})", held.empty() ? "" : "; ", site.path,
                        site.batch_norm->name(), extra, extra == 1 ? "" : "s");
  }
  TANDEM_CHECK_ARG(
      held.empty(),
      "convert_sync_batchnorm: BatchNorm held outside the module tree: {}. Such a reference "
      "is usually a member field (e.g. `torch::nn::BatchNorm2d bn1_`) that forward() calls "
      "directly; replacing the registered child cannot re-point it, so forward would keep "
      "running the old, unsynchronised BatchNorm. Nothing was converted. Fix: (1) declare "
      "the field as tandem::SyncBatchNorm (with no process group it is plain BatchNorm, and "
      "convert_sync_batchnorm attaches the group), (2) keep the BatchNorm in a "
      "torch::nn::Sequential, ModuleList or ModuleDict, or (3) drop other references (e.g. "
      "a local variable) before converting.",
      held);
}

// The container's own parameters, buffers and mode, carried to its rebuild.
// train() runs before any child is added so that it does not recurse.
void copy_own_state(const Module& from, Module& to) {
  to.train(from.is_training());
  for (const auto& p : from.named_parameters(/*recurse=*/false)) {
    to.register_parameter(p.key(), p.value(), p.value().requires_grad());
  }
  for (const auto& b : from.named_buffers(/*recurse=*/false)) {
    to.register_buffer(b.key(), b.value());
  }
}

// Sequential::forward walks its AnyModule list, so the list is rebuilt and
// assigned into the SAME object: holders of the Sequential stay valid.
void rebuild(torch::nn::SequentialImpl& seq, const Replacements& replacements) {
  const auto children = seq.named_children();
  TANDEM_CHECK(children.size() == seq.size(),
               "convert_sync_batchnorm: a Sequential has {} registered children but {} "
               "modules; it was changed with replace_module/register_module. Build it anew.",
               children.size(), seq.size());
  torch::nn::SequentialImpl rebuilt;
  copy_own_state(seq, rebuilt);
  for (size_t i = 0; i < seq.size(); ++i) {
    const torch::nn::AnyModule& module = seq.begin()[static_cast<std::ptrdiff_t>(i)];
    TANDEM_CHECK(module.ptr() == children[i].value(),
                 "convert_sync_batchnorm: Sequential child '{}' is not the module its forward "
                 "runs (replace_module was called on it?). Build the Sequential anew.",
                 children[i].key());
    const auto it = replacements.find(module.ptr().get());
    if (it == replacements.end()) {
      rebuilt.push_back(children[i].key(), module);
    } else {
      rebuilt.push_back(children[i].key(), torch::nn::AnyModule(it->second));
    }
  }
  seq = rebuilt;
}

void rebuild(torch::nn::ModuleListImpl& list, const Replacements& replacements) {
  torch::nn::ModuleListImpl rebuilt;
  copy_own_state(list, rebuilt);
  for (const auto& module : list) {
    const auto it = replacements.find(module.get());
    rebuilt.push_back(it == replacements.end() ? module
                                               : std::static_pointer_cast<Module>(it->second));
  }
  list = rebuilt;
}

// ModuleDict::update re-points both its own map and the registry.
void rebuild(torch::nn::ModuleDictImpl& dict, const Replacements& replacements) {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> updates;
  for (const auto& item : dict) {
    const auto it = replacements.find(item.value().get());
    if (it != replacements.end()) updates.emplace_back(item.key(), it->second);
  }
  dict.update(updates);
}

void install(const std::shared_ptr<Module>& parent, const std::vector<BatchNormSite>& sites,
             const Replacements& replacements) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(parent.get())) {
    rebuild(*seq, replacements);
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(parent.get())) {
    rebuild(*list, replacements);
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(parent.get())) {
    rebuild(*dict, replacements);
  } else {
    for (const auto& site : sites) {
      if (site.parent == parent) {
        parent->replace_module(site.name, replacements.at(site.batch_norm.get()));
      }
    }
  }
}

}  // namespace

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               std::shared_ptr<ProcessGroup> process_group) {
  TANDEM_CHECK_ARG(module != nullptr, "convert_sync_batchnorm got a null module");
  if (is_batch_norm(*module)) {
    return SyncBatchNormImpl::from_batch_norm(*module, std::move(process_group));
  }
  ConversionPlan plan;
  if (auto* sync_bn = dynamic_cast<SyncBatchNormImpl*>(module.get())) {
    if (!sync_bn->process_group()) plan.without_group.push_back(sync_bn);
  }
  std::unordered_set<const Module*> visited;
  collect(module, "", visited, plan);
  check_no_outside_holders(plan);

  Replacements replacements;
  std::vector<std::shared_ptr<Module>> parents;  // in tree order, each once
  for (const auto& site : plan.sites) {
    auto& sync_bn = replacements[site.batch_norm.get()];
    // A BatchNorm shared by several parents becomes one shared SyncBatchNorm.
    if (!sync_bn) sync_bn = SyncBatchNormImpl::from_batch_norm(*site.batch_norm, process_group);
    if (std::find(parents.begin(), parents.end(), site.parent) == parents.end()) {
      parents.push_back(site.parent);
    }
  }
  for (const auto& parent : parents) install(parent, plan.sites, replacements);
  for (auto* sync_bn : plan.without_group) sync_bn->set_process_group(process_group);
  return module;
}

}  // namespace tandem
