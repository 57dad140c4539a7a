#include "tandem/checkpoint/torch_import.h"

#include <nlohmann/json.hpp>

#include "checkpoint/torch_save_reader.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/core/error.h"

namespace tandem {

TorchImportResult import_torch_save(const std::string& source, const std::string& out_path) {
  detail::TorchSaveReader reader(source);
  TorchImportResult result;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::ordered_json values = nlohmann::ordered_json::object();
  using K = detail::PickleValue::Kind;
  for (const auto& [name, value] : detail::pickle_leaves(reader.root())) {
    switch (value->kind) {
      case K::kTensor: {
        at::Tensor t = reader.tensor(*value->tensor);
        result.tensor_bytes += t.numel() * static_cast<int64_t>(t.element_size());
        tensors.emplace_back(name, std::move(t));
        continue;
      }
      case K::kNone: values[name] = nullptr; break;
      case K::kBool: values[name] = value->boolean; break;
      case K::kInt: values[name] = value->integer; break;
      case K::kFloat: values[name] = value->number; break;
      case K::kString: values[name] = value->text; break;
      case K::kBytes: values[name] = nlohmann::ordered_json::binary(
                          std::vector<uint8_t>(value->text.begin(), value->text.end()));
        break;
      default: continue;  // empty containers: nothing to keep
    }
    ++result.other_values;
  }
  TANDEM_CHECK_ARG(!tensors.empty(),
                   "'{}' holds no tensor ({} other value(s)); nothing to import", source,
                   result.other_values);
  result.tensors = static_cast<int64_t>(tensors.size());
  std::map<std::string, std::string> metadata;
  if (!values.empty()) metadata["import.values"] = values.dump();
  metadata["import.source"] = source;
  write_safetensors(out_path, tensors, metadata);
  return result;
}

}  // namespace tandem
