#pragma once
// A restricted reader of Python pickles as torch.save writes them (the
// data.pkl of its zip archive; protocol 2, also 3-5): weights-only
// semantics, as torch.load(weights_only=True). It builds None, booleans,
// integers, floats, strings, bytes, lists, tuples, dicts (OrderedDict too),
// sets (as lists) and tensors (torch._utils._rebuild_tensor_v2 and
// _rebuild_parameter over persistent storage ids), and the few DeepSpeed
// classes its checkpoints pickle as data (LossScaler, fragment_address:
// dicts with "__class__"; ZeroStageEnum: an int); every other class or
// function a pickle names is refused, naming it, and nothing a pickle says
// is ever executed: it is data for this reader. LibTorch-free, so it is
// fuzzed on its own (fuzz/fuzz_pickle_reader.cpp); tensors come out as
// references to the archive's storage records, which
// checkpoint/torch_save_reader.h turns into at::Tensors.
//
// Limits against hostile input: at most 64 levels of nesting in the value
// returned, 1e7 objects, and the byte size of the input for strings.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::detail {

// A malformed or refused pickle. The message says what and where (the byte
// offset), without the file's path: callers rethrow it naming the file.
class PickleFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A tensor of the archive: elements [offset, ...) of storage record `key`
// (data/<key> in the zip), viewed with `sizes` and `strides` (in elements).
struct PickleTensor {
  std::string storage_key;
  std::string dtype;       // safetensors spelling: "F32", "BF16", "I64", "BOOL", ...
  std::string location;    // where it was saved from: "cpu", "cuda:0", ...
  int64_t storage_numel = 0;
  int64_t offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool requires_grad = false;
};

struct PickleValue;
using PickleRef = std::shared_ptr<PickleValue>;

struct PickleValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kTensor };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0;
  std::string text;                                  // kString, kBytes
  std::vector<PickleRef> items;                      // kList, kTuple
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // kDict, in insertion order
  std::shared_ptr<PickleTensor> tensor;              // kTensor
};

// Reads one pickle from `bytes` (up to its STOP). PickleFormatError for
// malformed input and for anything outside the weights-only set.
PickleRef read_pickle(std::string_view bytes);

// "None", "int", "dict", ... for messages.
const char* pickle_kind_name(PickleValue::Kind kind);
// dict[key] = value as Python sets it: a str or int key already there keeps
// its place and takes the new value; any other key is appended.
void pickle_dict_set(PickleValue& dict, PickleRef key, PickleRef value);
// dict[key] for a str (or int) key; nullptr when `dict` is no dict or has
// no such key.
const PickleValue* pickle_dict_find(const PickleValue& dict, std::string_view key);
const PickleValue* pickle_dict_find(const PickleValue& dict, int64_t key);

}  // namespace tandem::detail
