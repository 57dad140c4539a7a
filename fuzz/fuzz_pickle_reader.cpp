// libFuzzer target: the restricted pickle reader (what `tandem checkpoint
// import` runs on a torch.save archive's data.pkl) on hostile bytes.
//
// A pickle either reads to a value whose containers nest at most 64 deep
// and hold no cycle, or fails with PickleFormatError. Any other exception,
// a crash, a hang or a sanitizer report is a bug. Nothing a pickle names is
// ever called: the reader knows only the weights-only globals.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <unordered_set>

#include "checkpoint/pickle_reader.h"

namespace {

using tandem::detail::PickleValue;

// Walks every value once (shared ones too), checking the depth bound.
void walk(const PickleValue& v, int depth, std::unordered_set<const PickleValue*>& seen) {
  if (depth > 65) std::abort();
  if (!seen.insert(&v).second) return;
  (void)tandem::detail::pickle_kind_name(v.kind);
  if (v.kind == PickleValue::Kind::kTensor &&
      (v.tensor == nullptr || v.tensor->sizes.size() != v.tensor->strides.size())) {
    std::abort();
  }
  for (const auto& item : v.items) walk(*item, depth + 1, seen);
  for (const auto& [key, value] : v.entries) {
    walk(*key, depth + 1, seen);
    walk(*value, depth + 1, seen);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  try {
    auto root = tandem::detail::read_pickle(
        std::string_view(reinterpret_cast<const char*>(data), size));
    std::unordered_set<const PickleValue*> seen;
    walk(*root, 0, seen);
  } catch (const tandem::detail::PickleFormatError&) {
  }
  return 0;
}
