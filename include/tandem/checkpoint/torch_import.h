#pragma once
// Python checkpoints into tandem: a torch.save file (a model's state_dict,
// a Hugging Face pytorch_model.bin, any dict of tensors and numbers) read
// with weights-only semantics and written as one safetensors file, which
// Accelerator::load_model, tandem::load_safetensors and
// tandem::load_module_weights read. What `tandem checkpoint import` does.
//
// Weights only, as torch.load(weights_only=True): tensors, containers and
// numbers are built; a pickle that names any other class or function is
// refused (CheckpointError naming it), and nothing in the file is executed.
// Tensors are named by their path of dict keys and list indices joined by
// '.' ("model.fc.weight" for {"model": {"fc.weight": ...}}); the other
// values (numbers, strings, booleans, None) are kept as JSON in the file's
// metadata under "import.values".

#include <cstdint>
#include <string>

namespace tandem {

struct TorchImportResult {
  int64_t tensors = 0;       // written to the safetensors file
  int64_t tensor_bytes = 0;
  int64_t other_values = 0;  // numbers, strings, ... kept in the metadata
};

// Reads `source` and writes `out_path` (replacing it). CheckpointError for
// an unreadable, malformed or refused file (the output is not written),
// UsageError when it holds no tensor.
TorchImportResult import_torch_save(const std::string& source, const std::string& out_path);

}  // namespace tandem
