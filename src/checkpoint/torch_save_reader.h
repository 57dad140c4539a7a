#pragma once
// A torch.save file (the zip archive PyTorch writes since 1.6: data.pkl plus
// one record per storage) read with weights-only semantics: the restricted
// pickle reader (pickle_reader.h) builds the values, and the tensors are
// read from their storage records here. What `tandem checkpoint import`
// reads; nothing in the file is ever executed.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "checkpoint/pickle_reader.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace tandem::detail {

class TorchSaveReader {
 public:
  // Opens and unpickles `path`: CheckpointError naming the file when it is
  // missing, not a torch.save zip archive (the pre-1.6 format included),
  // malformed, or refers to anything a weights-only read does not build.
  explicit TorchSaveReader(const std::string& path);
  ~TorchSaveReader();
  TorchSaveReader(const TorchSaveReader&) = delete;
  TorchSaveReader& operator=(const TorchSaveReader&) = delete;

  const PickleValue& root() const { return *root_; }
  // The tensor `t` describes, as a contiguous CPU tensor of its own
  // (storages shared by several tensors are read once). CheckpointError for
  // a missing or short storage record, or a view outside its storage.
  at::Tensor tensor(const PickleTensor& t);
  // `value` as JSON: dicts (str or int keys, in order) as objects, lists and
  // tuples as arrays, bytes as JSON binary, a one-element tensor as its
  // number and any other tensor as nested arrays (torch's tolist()).
  // CheckpointError naming `where` for another key type or a tensor of
  // more than a million elements (JSON is no place for those).
  nlohmann::ordered_json json(const PickleValue& value, const std::string& where);

 private:
  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip_;
  PickleRef root_;
  std::map<std::string, at::Tensor> storages_;
};

// The leaves of `value` under dotted names: dict keys (strings or ints)
// and list/tuple indices joined by '.', `prefix` first. At most
// `max_leaves` values visited (CheckpointError beyond: shared values can
// make a small file name very many).
std::vector<std::pair<std::string, const PickleValue*>> pickle_leaves(
    const PickleValue& value, const std::string& prefix = "", int64_t max_leaves = 10'000'000);

}  // namespace tandem::detail
