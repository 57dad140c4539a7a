#include "checkpoint/pickle_globals.h"

#include <cstdint>
#include <map>

namespace tandem::detail {

std::string storage_dtype(const std::string& type) {
  static const std::map<std::string, std::string> dtypes = {
      {"FloatStorage", "F32"},   {"DoubleStorage", "F64"}, {"HalfStorage", "F16"},
      {"BFloat16Storage", "BF16"}, {"LongStorage", "I64"}, {"IntStorage", "I32"},
      {"ShortStorage", "I16"},   {"CharStorage", "I8"},    {"ByteStorage", "U8"},
      {"BoolStorage", "BOOL"}};
  auto it = dtypes.find(type);
  return it == dtypes.end() ? std::string() : it->second;
}

bool deepspeed_record(const std::string& module, const std::string& name) {
  return (module == "deepspeed.runtime.fp16.loss_scaler" &&
          (name == "LossScaler" || name == "DynamicLossScaler")) ||
         (module == "deepspeed.utils.tensor_fragment" && name == "fragment_address");
}

bool allowed_global(const std::string& module, const std::string& name) {
  if (deepspeed_record(module, name)) return true;
  if (module == "deepspeed.runtime.zero.config") return name == "ZeroStageEnum";
  if (module == "torch._tensor") return name == "_rebuild_from_type_v2";
  if (module == "torch._utils") {
    return name == "_rebuild_tensor_v2" || name == "_rebuild_tensor" ||
           name == "_rebuild_parameter";
  }
  if (module == "collections") return name == "OrderedDict";
  if (module == "torch") return name == "Size" || name == "Tensor" || !storage_dtype(name).empty();
  if (module == "builtins" || module == "__builtin__") return name == "set" || name == "frozenset";
  if (module == "_codecs") return name == "encode";
  return false;
}

bool latin1_bytes(const std::string& text, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      out->push_back(
          static_cast<char>(((c & 0x1F) << 6) | (static_cast<uint8_t>(text[++i]) & 0x3F)));
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace tandem::detail
