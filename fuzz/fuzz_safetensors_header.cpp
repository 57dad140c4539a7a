// libFuzzer target: the safetensors header parser on hostile bytes.
//
// Each input is tried two ways:
//   1. as a whole file: length prefix, header, data section (the reader's
//      view, checksums of the data included);
//   2. as [u64 data-section size][header JSON], so that mutations of the JSON
//      need not keep a length prefix consistent to reach the deep checks.
// A header that parses must survive build_safetensors_header() and parse
// again to the same entries and metadata, and the hardware CRC-32C must
// agree with the table one. Anything else than SafetensorsFormatError from
// the parser is a bug, and so is any sanitizer report.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors_header.h"

namespace {

using namespace tandem::detail;

void check(bool condition) {
  if (!condition) std::abort();
}

bool same(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  if (a.entries.size() != b.entries.size() || a.metadata != b.metadata) return false;
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    const auto& x = a.entries[i];
    const auto& y = b.entries[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.numel != y.numel ||
        x.data_begin != y.data_begin || x.data_end != y.data_end) {
      return false;
    }
  }
  return true;
}

// A parsed header written again by tandem's builder must read back the same.
void round_trip(const SafetensorsHeader& header, uint64_t data_size) {
  std::vector<uint32_t> crcs = header.has_crc32c ? header.crc32c
                                                 : std::vector<uint32_t>(header.entries.size(), 0);
  std::string built;
  try {
    built = build_safetensors_header(header.entries, header.metadata, crcs);
  } catch (const std::invalid_argument&) {
    return;  // names tandem reserves ("__header__") in a foreign file
  }
  check((8 + built.size()) % 8 == 0);
  const SafetensorsHeader again = parse_safetensors_header(built, data_size);
  check(again.has_crc32c && again.crc32c == crcs && same(header, again));
}

void as_file(const uint8_t* data, std::size_t size) {
  uint64_t n = 0;
  try {
    n = parse_safetensors_header_length(data, size, size);
  } catch (const SafetensorsFormatError&) {
    return;
  }
  check(n >= 2 && n <= size - 8);
  const std::string_view json(reinterpret_cast<const char*>(data) + 8, n);
  const uint8_t* section = data + 8 + n;
  const uint64_t data_size = size - 8 - n;
  try {
    const SafetensorsHeader header = parse_safetensors_header(json, data_size);
    for (std::size_t i = 0; i < header.entries.size(); ++i) {
      const auto& e = header.entries[i];
      check(e.data_begin >= 0 && e.data_begin <= e.data_end &&
            static_cast<uint64_t>(e.data_end) <= data_size);
      const uint32_t crc = crc32c(section + e.data_begin, e.data_end - e.data_begin);
      if (header.has_crc32c) (void)(crc == header.crc32c[i]);
    }
    round_trip(header, data_size);
  } catch (const SafetensorsFormatError&) {
  }
}

void as_header(const uint8_t* data, std::size_t size) {
  if (size < 8) return;
  uint64_t data_size = 0;
  std::memcpy(&data_size, data, 8);
  data_size &= (uint64_t{1} << 40) - 1;
  try {
    const SafetensorsHeader header =
        parse_safetensors_header(std::string_view(reinterpret_cast<const char*>(data) + 8, size - 8),
                                 data_size);
    round_trip(header, data_size);
  } catch (const SafetensorsFormatError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  as_file(data, size);
  as_header(data, size);
  // Differential: hardware vs table CRC over the input, split at a point.
  const std::size_t split = size ? data[0] % (size + 1) : 0;
  const uint32_t whole = crc32c_extend_portable(0, data, size);
  check(crc32c_extend(crc32c_extend(0, data, split), data + split, size - split) == whole);
  return 0;
}
