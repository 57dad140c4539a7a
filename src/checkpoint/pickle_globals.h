#pragma once
// The globals a weights-only pickle read knows (pickle_reader.h): what
// torch.save and DeepSpeed's checkpoints name, and nothing else. The machine
// in pickle_reader.cpp refuses every other one by name. LibTorch-free.

#include <string>

namespace tandem::detail {

// Whether `module`.`name` is one the reader builds (or takes as an argument:
// storage types, torch.Tensor).
bool allowed_global(const std::string& module, const std::string& name);

// DeepSpeed's classes that its checkpoints pickle as plain data, read as
// dicts of their pickled state with "__class__" set (no code of theirs runs).
bool deepspeed_record(const std::string& module, const std::string& name);

// The safetensors dtype ("F32", ...) of torch.<type> (FloatStorage, ...), or
// "" for a name that is no storage type.
std::string storage_dtype(const std::string& type);

// _codecs.encode(text, "latin1") as protocol 2 pickles bytes: the UTF-8
// `text`'s code points, each one byte. False when one is above 0xFF.
bool latin1_bytes(const std::string& text, std::string* out);

}  // namespace tandem::detail
