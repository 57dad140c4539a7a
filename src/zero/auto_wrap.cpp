// auto_wrap(): FSDP's wrap policies for LibTorch models, at the elements of
// torch::nn::Sequential (the one call tandem can intercept; auto_wrap.h).

#include "tandem/zero/auto_wrap.h"

#include <algorithm>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/container/sequential.h>

#include "tandem/core/error.h"
#include "zero/auto_unit.h"

namespace tandem {
namespace {

using detail::AutoUnitImpl;

// Where each Sequential element's entry lives, by the element (the wrapped
// one for an entry auto_wrap() replaced before).
struct Entry {
  torch::nn::AnyModule* slot = nullptr;
  bool wrapped = false;
};

std::unordered_map<const torch::nn::Module*, Entry> sequential_entries(torch::nn::Module& model) {
  std::unordered_map<const torch::nn::Module*, Entry> out;
  for (const auto& module : model.modules(/*include_self=*/true)) {
    auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(module.get());
    if (seq == nullptr) continue;
    for (auto it = seq->begin(); it != seq->end(); ++it) {
      auto* unit = dynamic_cast<AutoUnitImpl*>(it->ptr().get());
      out[unit != nullptr ? &unit->wrapped() : it->ptr().get()] = {&*it, unit != nullptr};
    }
  }
  return out;
}

// The type name a policy matches: "ns::BlockImpl" answers to itself,
// "BlockImpl" and "Block".
bool type_matches(const std::string& type, const std::vector<std::string>& names) {
  const auto colon = type.rfind("::");
  const std::string bare = colon == std::string::npos ? type : type.substr(colon + 2);
  std::string stem = bare;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, "Impl") == 0) {
    stem.resize(stem.size() - 4);
  }
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    return n == type || n == bare || n == stem;
  });
}

int64_t own_numel(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/false)) n += p.numel();
  return n;
}

}  // namespace

namespace detail {

std::unordered_map<const torch::nn::Module*, ShardedUnit*> auto_units(torch::nn::Module& model) {
  std::unordered_map<const torch::nn::Module*, ShardedUnit*> out;
  for (const auto& [module, entry] : sequential_entries(model)) {
    if (entry.wrapped) out[module] = dynamic_cast<AutoUnitImpl*>(entry.slot->ptr().get());
  }
  return out;
}

}  // namespace detail

std::vector<std::string> auto_wrap(torch::nn::Module& model, const AutoWrapOptions& options) {
  if (options.policy == AutoWrapOptions::kNone) return {};
  auto entries = sequential_entries(model);
  std::set<const torch::nn::Module*> chosen;
  if (options.policy == AutoWrapOptions::kTransformerLayer) {
    TANDEM_CHECK_ARG(!options.layer_types.empty(),
                     "auto_wrap: the transformer-layer policy needs the layer type names to "
                     "wrap (fsdp_transformer_layer_cls_to_wrap)");
    for (const auto& item : model.named_modules("", /*include_self=*/false)) {
      const auto& module = item.value();
      if (!type_matches(module->name(), options.layer_types)) continue;
      TANDEM_CHECK_ARG(entries.count(module.get()) > 0,
                       "auto_wrap: '{}' ({}) is a layer to wrap, but no torch::nn::Sequential "
                       "calls it, and LibTorch modules have no forward hooks, so tandem cannot "
                       "gather its parameters around its forward. Declare it "
                       "tandem::Sharded<{}> in the model (tandem/zero/sharded.h), or hold the "
                       "layers in a torch::nn::Sequential",
                       item.key(), module->name(), module->name());
      chosen.insert(module.get());
    }
    if (chosen.empty()) {
      std::set<std::string> types;
      for (const auto& m : model.modules(/*include_self=*/false)) types.insert(m->name());
      TANDEM_THROW(UsageError,
                   "auto_wrap: no module of the model has a type named '{}'; its module types "
                   "are '{}' (a name matches with or without its namespaces and Impl suffix)",
                   fmt::join(options.layer_types, "', '"), fmt::join(types, "', '"));
    }
  } else {
    TANDEM_CHECK_ARG(options.min_num_params >= 1,
                     "auto_wrap: min_num_params must be >= 1, got {}", options.min_num_params);
    // Post-order: a module's count is its own parameters plus its children's
    // not already wrapped; the root is never wrapped (it is the outer unit).
    std::function<int64_t(torch::nn::Module&, bool)> visit = [&](torch::nn::Module& m,
                                                                 bool root) -> int64_t {
      int64_t n = own_numel(m);
      for (const auto& child : m.children()) n += visit(*child, false);
      if (!root && n >= options.min_num_params && entries.count(&m) > 0) {
        chosen.insert(&m);
        return 0;
      }
      return n;
    };
    visit(model, true);
  }
  std::vector<std::string> paths;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const torch::nn::Module* m = item.value().get();
    if (chosen.count(m) == 0) continue;
    Entry& entry = entries.at(m);
    if (!entry.wrapped) {
      *entry.slot = torch::nn::AnyModule(std::make_shared<AutoUnitImpl>(std::move(*entry.slot)));
      entry.wrapped = true;
    }
    paths.push_back(item.key());
  }
  return paths;
}

}  // namespace tandem
