#pragma once
// ZeRO-3 units chosen by a policy instead of tandem::Sharded<Impl> in the
// model's code: FSDP's auto_wrap_policy (Accelerate's fsdp_auto_wrap_policy,
// fsdp_min_num_params, fsdp_transformer_layer_cls_to_wrap).
//
//   tandem::ZeroOptions options;
//   options.stage = 3;
//   options.auto_wrap.policy = tandem::AutoWrapOptions::kTransformerLayer;
//   options.auto_wrap.layer_types = {"Block"};   // BlockImpl, ns::BlockImpl
//   tandem::ZeroOptimizer zero(model, adamw, pg, options);
//
// LibTorch modules have no forward hooks, so tandem gathers a unit around the
// one call it can intercept without the model's code: an element of a
// torch::nn::Sequential, which the Sequential calls through a type-erased
// torch::nn::AnyModule. auto_wrap() replaces that entry with a pass-through
// unit (names, parameters and registered children stay as they were). So:
//   kSize              wraps, bottom-up, each Sequential element whose
//                      parameters not yet in a unit number at least
//                      min_num_params (FSDP's size_based_auto_wrap_policy,
//                      whose default of 1e8 this keeps); a module it would
//                      wrap that is no Sequential element leaves its count
//                      to its parent, so units come out coarser, never missed;
//   kTransformerLayer  wraps every module whose type name is listed (the
//                      name with or without namespaces and an Impl suffix);
//                      one that is no Sequential element is refused, naming
//                      it (declare it tandem::Sharded<Impl>, or hold the
//                      layers in a torch::nn::Sequential).
// The wrapped element must be called with one tensor and return one (as a
// Sequential's elements after the first are). With neither policy nor a
// tandem::Sharded unit, stage 3 keeps every parameter whole on every rank,
// as FSDP's root unit does without a wrap policy, and shards gradients and
// optimizer state (a warning says so).

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace tandem {

struct AutoWrapOptions {
  enum Policy { kNone, kSize, kTransformerLayer };
  Policy policy = kNone;
  int64_t min_num_params = 100'000'000;  // kSize
  std::vector<std::string> layer_types;  // kTransformerLayer
};

// Wraps the Sequential elements `options` picks in `model` as stage-3
// units, and returns their module paths in pre-order. Elements wrapped
// before stay wrapped (calling it twice wraps nothing new). UsageError for
// kTransformerLayer with no type names, a listed layer that is no Sequential
// element, or one that matches no module at all. Not thread-safe: call it
// before training, on every rank alike.
std::vector<std::string> auto_wrap(torch::nn::Module& model, const AutoWrapOptions& options);

}  // namespace tandem
