// PickleValue's operations (pickle_reader.h), apart from the machine that
// builds values.

#include "checkpoint/pickle_reader.h"

namespace tandem::detail {

void pickle_dict_set(PickleValue& dict, PickleRef key, PickleRef value) {
  for (auto& [k, v] : dict.entries) {
    const bool same_str = k->kind == PickleValue::Kind::kString &&
                          key->kind == PickleValue::Kind::kString && k->text == key->text;
    const bool same_int = k->kind == PickleValue::Kind::kInt &&
                          key->kind == PickleValue::Kind::kInt && k->integer == key->integer;
    if (same_str || same_int) {
      v = std::move(value);
      return;
    }
  }
  dict.entries.emplace_back(std::move(key), std::move(value));
}

const PickleValue* pickle_dict_find(const PickleValue& dict, std::string_view key) {
  if (dict.kind != PickleValue::Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict.entries) {
    if (k->kind == PickleValue::Kind::kString && k->text == key) return v.get();
  }
  return nullptr;
}

const PickleValue* pickle_dict_find(const PickleValue& dict, int64_t key) {
  if (dict.kind != PickleValue::Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict.entries) {
    if (k->kind == PickleValue::Kind::kInt && k->integer == key) return v.get();
  }
  return nullptr;
}

const char* pickle_kind_name(PickleValue::Kind kind) {
  switch (kind) {
    case PickleValue::Kind::kNone: return "None";
    case PickleValue::Kind::kBool: return "bool";
    case PickleValue::Kind::kInt: return "int";
    case PickleValue::Kind::kFloat: return "float";
    case PickleValue::Kind::kString: return "str";
    case PickleValue::Kind::kBytes: return "bytes";
    case PickleValue::Kind::kList: return "list";
    case PickleValue::Kind::kTuple: return "tuple";
    case PickleValue::Kind::kDict: return "dict";
    case PickleValue::Kind::kTensor: return "tensor";
  }
  return "?";
}

}  // namespace tandem::detail
