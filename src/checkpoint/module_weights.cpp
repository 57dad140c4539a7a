#include "tandem/checkpoint/module_weights.h"

#include <unistd.h>

#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "checkpoint/checkpoint_fs.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"
#include "tandem/core/parameters.h"

namespace tandem {
// A named namespace, not an anonymous one: unity builds put this file in one
// translation unit with other checkpoint sources.
namespace module_weights {

// One distinct tensor of the module and every name it is registered under.
struct Slot {
  at::Tensor tensor;
  std::vector<std::string> names;
};

std::vector<Slot> module_slots(const torch::nn::Module& module) {
  std::vector<Slot> slots;
  for (auto& p : unique_named_parameters(module)) {
    Slot slot{p.tensor, {p.name}};
    slot.names.insert(slot.names.end(), p.aliases.begin(), p.aliases.end());
    slots.push_back(std::move(slot));
  }
  for (auto& [name, buffer] : unique_named_buffers(module)) slots.push_back({buffer, {name}});
  return slots;
}

// At most `limit` names, then "... and N more".
std::string some(const std::vector<std::string>& names, std::size_t limit = 10) {
  std::vector<std::string> shown(names.begin(),
                                 names.begin() + static_cast<long>(std::min(limit, names.size())));
  std::string text = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > limit) text += fmt::format(" ... and {} more", names.size() - limit);
  return text;
}

std::string shape_text(at::IntArrayRef shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Floating <-> floating and integer <-> integer convert; anything else is
// probably the wrong file.
bool convertible(at::ScalarType from, at::ScalarType to) {
  if (from == to) return true;
  const bool from_float = at::isFloatingType(from);
  const bool to_float = at::isFloatingType(to);
  if (from_float || to_float) return from_float && to_float;
  const bool from_int = at::isIntegralType(from, /*includeBool=*/false);
  const bool to_int = at::isIntegralType(to, /*includeBool=*/false);
  return from_int && to_int;
}

// The copy plan: a slot and the file entry it loads from.
struct Copy {
  const Slot* slot;
  const SafetensorsEntry* entry;
};

}  // namespace module_weights

LoadSafetensorsResult load_safetensors(torch::nn::Module& module, const std::string& path,
                                       const LoadSafetensorsOptions& options) {
  using namespace module_weights;
  SafetensorsReader reader(path);
  const std::vector<Slot> slots = module_slots(module);

  // File names as the module spells them (prefix removed).
  std::map<std::string, const SafetensorsEntry*> by_module_name;
  LoadSafetensorsResult result;
  for (const auto& entry : reader.entries()) {
    if (entry.name.compare(0, options.prefix.size(), options.prefix) != 0) {
      result.unexpected.push_back(entry.name);
      continue;
    }
    by_module_name[entry.name.substr(options.prefix.size())] = &entry;
  }

  std::vector<Copy> copies;
  std::vector<std::string> problems;
  std::set<std::string> matched;
  for (const Slot& slot : slots) {
    std::vector<const SafetensorsEntry*> found;
    for (const auto& name : slot.names) {
      auto it = by_module_name.find(name);
      if (it == by_module_name.end()) continue;
      found.push_back(it->second);
      matched.insert(name);
    }
    if (found.empty()) {
      result.missing.insert(result.missing.end(), slot.names.begin(), slot.names.end());
      continue;
    }
    for (const SafetensorsEntry* entry : found) {
      const std::string& name = entry->name;
      if (!slot.tensor.sizes().equals(entry->shape)) {
        problems.push_back(fmt::format("{}: the file holds shape {}, the module {}", name,
                                       shape_text(entry->shape), shape_text(slot.tensor.sizes())));
      } else if (!convertible(entry->dtype, slot.tensor.scalar_type())) {
        problems.push_back(fmt::format("{}: the file holds {}, the module {}; tandem converts "
                                       "only between floating types or between integer types",
                                       name, safetensors_dtype_name(entry->dtype),
                                       c10::toString(slot.tensor.scalar_type())));
      }
    }
    copies.push_back({&slot, found.front()});
    // Tied names stored separately must agree, or one of them would be lost.
    for (std::size_t i = 1; i < found.size() && problems.empty(); ++i) {
      if (!at::equal(reader.read(found.front()->name), reader.read(found[i]->name))) {
        problems.push_back(fmt::format("{} and {} are one tied tensor in the module but hold "
                                       "different values in the file",
                                       found.front()->name, found[i]->name));
      }
    }
  }
  for (const auto& [name, entry] : by_module_name) {
    if (matched.count(name) == 0) result.unexpected.push_back(entry->name);
  }

  TANDEM_CHECK_ARG(problems.empty(), "load_safetensors: '{}' does not fit the module ({} "
                   "problem(s); nothing was loaded): {}",
                   path, problems.size(), some(problems, 5));
  if (options.strict && (!result.missing.empty() || !result.unexpected.empty())) {
    std::string what;
    if (!result.missing.empty()) {
      what += fmt::format(" missing from the file ({}): {}.", result.missing.size(),
                          some(result.missing));
    }
    if (!result.unexpected.empty()) {
      what += fmt::format(" not in the module ({}): {}.", result.unexpected.size(),
                          some(result.unexpected));
    }
    TANDEM_THROW(UsageError,
                 "load_safetensors: '{}' and the module differ in names, and nothing was "
                 "loaded;{} If the file's names carry a prefix, set "
                 "LoadSafetensorsOptions::prefix; to load what matches, set strict = false.",
                 path, what);
  }

  torch::NoGradGuard no_grad;
  for (const Copy& copy : copies) {
    try {
      copy.slot->tensor.copy_(reader.read(copy.entry->name));
    } catch (const CheckpointError& e) {
      TANDEM_THROW(CheckpointError,
                   "load_safetensors: reading '{}' from '{}' failed after {} of {} tensors were "
                   "loaded (the module now mixes old and new values): {}",
                   copy.entry->name, path, result.loaded.size(), copies.size(), e.what());
    }
    result.loaded.insert(result.loaded.end(), copy.slot->names.begin(), copy.slot->names.end());
  }
  return result;
}

void save_safetensors(const torch::nn::Module& module, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  using namespace module_weights;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const Slot& slot : module_slots(module)) {
    tensors.emplace_back(slot.names.front(), slot.tensor.detach());
  }
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    write_safetensors(temp, tensors, metadata);
    detail::rename_path(temp, path);
  } catch (...) {
    detail::remove_tree_quietly(temp);
    throw;
  }
}

}  // namespace tandem
