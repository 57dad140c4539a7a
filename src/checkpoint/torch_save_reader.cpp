#include "checkpoint/torch_save_reader.h"

#include <cstring>
#include <functional>
#include <optional>
#include <string_view>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

at::ScalarType scalar_type_of(const std::string& dtype) {
  static const std::map<std::string, at::ScalarType> types = {
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},  {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},   {"BOOL", at::kBool}};
  return types.at(dtype);  // pickle_reader only makes these
}

// A dict key as a name: a str as it is, an int in decimal; nullopt for
// any other kind.
std::optional<std::string> key_text(const PickleValue& key) {
  if (key.kind == PickleValue::Kind::kString) return key.text;
  if (key.kind == PickleValue::Kind::kInt) return std::to_string(key.integer);
  return std::nullopt;
}

}  // namespace

TorchSaveReader::TorchSaveReader(const std::string& path) : path_(path) {
  try {
    zip_ = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    TANDEM_THROW(CheckpointError,
                 "'{}' is not a torch.save archive tandem can read ({}): it must be a file "
                 "torch.save wrote with PyTorch 1.6 or later (a zip archive); load and save it "
                 "again with a current PyTorch if it is older",
                 path, e.what_without_backtrace());
  }
  if (zip_->hasRecord("byteorder")) {
    auto [data, size] = zip_->getRecord("byteorder");
    const std::string order(static_cast<const char*>(data.get()), size);
    TANDEM_CHECK_ARG(order == "little", "'{}' was saved on a {}-endian machine; tandem reads "
                                        "little-endian archives only",
                     path, order);
  }
  TANDEM_CHECK_FILE(zip_->hasRecord("data.pkl"), "'{}' has no data.pkl: not a torch.save archive",
               path);
  auto [data, size] = zip_->getRecord("data.pkl");
  try {
    root_ = read_pickle(std::string_view(static_cast<const char*>(data.get()), size));
  } catch (const PickleFormatError& e) {
    TANDEM_THROW(CheckpointError, "'{}': {}", path, e.what());
  }
}

TorchSaveReader::~TorchSaveReader() = default;

at::Tensor TorchSaveReader::tensor(const PickleTensor& t) {
  const at::ScalarType type = scalar_type_of(t.dtype);
  auto it = storages_.find(t.storage_key);
  if (it == storages_.end()) {
    const std::string record = "data/" + t.storage_key;
    if (!zip_->hasRecord(record)) {
      TANDEM_THROW(CheckpointError, "'{}' names storage '{}' but has no record {}", path_,
                   t.storage_key, record);
    }
    auto [data, size] = zip_->getRecord(record);
    const int64_t bytes = t.storage_numel * static_cast<int64_t>(c10::elementSize(type));
    if (static_cast<int64_t>(size) < bytes) {
      TANDEM_THROW(CheckpointError,
                   "'{}': storage '{}' holds {} bytes, fewer than its {} {} elements need", path_,
                   t.storage_key, size, t.storage_numel, t.dtype);
    }
    at::Tensor storage = at::empty({t.storage_numel}, at::TensorOptions().dtype(type));
    if (bytes > 0) std::memcpy(storage.data_ptr(), data.get(), bytes);
    it = storages_.emplace(t.storage_key, storage).first;
  }
  const at::Tensor& storage = it->second;
  TANDEM_CHECK_FILE(storage.scalar_type() == type,
               "'{}': storage '{}' is read as {} and as {}", path_, t.storage_key,
               c10::toString(storage.scalar_type()), t.dtype);
  // The view must lie inside the storage.
  int64_t last = t.offset;
  bool empty = false;
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0 || t.strides[d] < 0) {
      TANDEM_THROW(CheckpointError, "'{}': a tensor with a negative size or stride", path_);
    }
    if (t.sizes[d] == 0) empty = true;
    else last += (t.sizes[d] - 1) * t.strides[d];
  }
  if (t.offset < 0 || (!empty && last >= storage.numel())) {
    TANDEM_THROW(CheckpointError,
                 "'{}': a tensor views elements up to {} of storage '{}', which has {}", path_,
                 last, t.storage_key, storage.numel());
  }
  if (empty) return at::empty(t.sizes, storage.options());
  return storage.as_strided(t.sizes, t.strides, t.offset).clone(at::MemoryFormat::Contiguous);
}

nlohmann::ordered_json TorchSaveReader::json(const PickleValue& value, const std::string& where) {
  using K = PickleValue::Kind;
  using Json = nlohmann::ordered_json;
  switch (value.kind) {
    case K::kNone: return nullptr;
    case K::kBool: return value.boolean;
    case K::kInt: return value.integer;
    case K::kFloat: return value.number;
    case K::kString: return value.text;
    case K::kBytes:
      return Json::binary(std::vector<uint8_t>(value.text.begin(), value.text.end()));
    case K::kList:
    case K::kTuple: {
      Json out = Json::array();
      for (std::size_t i = 0; i < value.items.size(); ++i) {
        out.push_back(json(*value.items[i], where + "." + std::to_string(i)));
      }
      return out;
    }
    case K::kDict: {
      Json out = Json::object();
      for (const auto& [key, item] : value.entries) {
        const std::optional<std::string> name = key_text(*key);
        if (!name) {
          TANDEM_THROW(CheckpointError, "'{}': '{}' has a dict key of type {}; only str and int "
                                        "keys carry over to JSON",
                       path_, where, pickle_kind_name(key->kind));
        }
        const std::string& k = *name;
        out[k] = json(*item, where + "." + k);
      }
      return out;
    }
    case K::kTensor: break;
  }
  at::Tensor t = tensor(*value.tensor);
  TANDEM_CHECK_FILE(t.numel() <= 1'000'000,
               "'{}': '{}' is a tensor of {} elements, too large for a checkpoint's JSON state",
               path_, where, t.numel());
  t = t.to(t.is_floating_point() ? at::kDouble : at::kLong);
  std::function<Json(const at::Tensor&)> to_json = [&](const at::Tensor& x) -> Json {
    if (x.dim() == 0) {
      if (value.tensor->dtype == "BOOL") return x.item<int64_t>() != 0;
      return x.is_floating_point() ? Json(x.item<double>()) : Json(x.item<int64_t>());
    }
    Json out = Json::array();
    for (int64_t i = 0; i < x.size(0); ++i) out.push_back(to_json(x[i]));
    return out;
  };
  return to_json(t.numel() == 1 ? t.reshape({}) : t);
}

std::vector<std::pair<std::string, const PickleValue*>> pickle_leaves(const PickleValue& value,
                                                                      const std::string& prefix,
                                                                      int64_t max_leaves) {
  std::vector<std::pair<std::string, const PickleValue*>> out;
  int64_t visits = 0;  // shared values are walked once per path to them
  std::function<void(const PickleValue&, const std::string&)> walk =
      [&](const PickleValue& v, const std::string& name) {
        if (++visits > max_leaves) {
          TANDEM_THROW(CheckpointError, "more than {} values in one file", max_leaves);
        }
        auto child = [&](const std::string& key) { return name.empty() ? key : name + "." + key; };
        using K = PickleValue::Kind;
        if (v.kind == K::kDict) {
          for (const auto& [key, item] : v.entries) {
            const std::optional<std::string> k = key_text(*key);
            if (!k) {
              TANDEM_THROW(CheckpointError, "'{}': a dict key of type {}; tandem names values "
                                            "by str or int keys",
                           name, pickle_kind_name(key->kind));
            }
            walk(*item, child(*k));
          }
          return;
        }
        if (v.kind == K::kList || v.kind == K::kTuple) {
          for (std::size_t i = 0; i < v.items.size(); ++i) walk(*v.items[i], child(std::to_string(i)));
          return;
        }
        out.emplace_back(name, &v);
      };
  walk(value, prefix);
  return out;
}

}  // namespace tandem::detail
