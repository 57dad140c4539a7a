#pragma once
// The JSON layer of the safetensors header parser (safetensors_header.h):
// a SAX pass that builds only what the format allows, so a hostile header
// can neither nest deeply nor expand in memory, and that rejects duplicate
// keys (a DOM parser silently keeps the last one). Torch-free.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::detail {

// One tensor entry as written, not yet checked against dtypes and offsets.
struct RawHeaderEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t data_begin = 0;
  int64_t data_end = 0;
};

struct RawHeader {
  std::vector<RawHeaderEntry> entries;          // in file order
  std::map<std::string, std::string> metadata;  // __metadata__, all keys
};

// Parses the header JSON: an object of tensor entries, each exactly
// {"dtype": string, "shape": [non-negative ints], "data_offsets": [int, int]},
// and an optional "__metadata__" of strings. Throws SafetensorsFormatError.
RawHeader parse_header_json(std::string_view json);

// Parses a JSON object of strings (`what` names it in messages). Throws
// SafetensorsFormatError.
std::map<std::string, std::string> parse_string_map(std::string_view json, const char* what);

}  // namespace tandem::detail
