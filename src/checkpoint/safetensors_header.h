#pragma once
// The safetensors header, torch-free: validation of the bytes a reader got
// from disk, and the header a writer puts there. Only std and nlohmann_json,
// so the fuzz target builds it with clang and sanitizers without LibTorch.
//
// File layout (https://github.com/huggingface/safetensors):
//   u64 little-endian N | N bytes of UTF-8 JSON, space-padded | data section
// The JSON object maps each tensor name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// (offsets relative to the data section), plus an optional
// "__metadata__": {string: string}. The entries must tile the data section
// exactly: no overlaps, no holes, no trailing bytes.
//
// tandem's checksums live in __metadata__ under kCrcMetadataKey, a JSON
// string holding {"__header__": "xxxxxxxx", "<tensor>": "xxxxxxxx", ...}
// with 8 lowercase hex digits each (fixed width, so a writer knows the
// header's length before it knows the checksums):
//   <tensor>    CRC-32C of the tensor's data bytes;
//   __header__  CRC-32C of safetensors_layout_bytes(): every entry's name,
//               dtype, shape and offsets plus the user metadata, so that a
//               bit flip which leaves the JSON valid still cannot change what
//               the reader returns.

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::detail {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // as the reference reader
inline constexpr std::size_t kSafetensorsMaxDims = 1024;
inline constexpr const char* kCrcMetadataKey = "tandem.crc32c";
inline constexpr const char* kHeaderCrcName = "__header__";

// The dtypes tandem reads and writes: every safetensors dtype that LibTorch
// has a type for, element for element. F4 and F6_* (no LibTorch type holds
// one element per safetensors element) and C64 are refused.
enum class SafetensorsDtype : uint8_t {
  kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool,
  kU64, kU32, kU16,
  kF8E4M3, kF8E5M2, kF8E4M3Fnuz, kF8E5M2Fnuz, kF8E8M0,
};

// "F32", ...
const char* safetensors_dtype_string(SafetensorsDtype dtype);
int64_t safetensors_dtype_size(SafetensorsDtype dtype);

// A malformed file. The message says what is wrong and what to do, without
// the file's path: callers rethrow it as a CheckpointError naming the file.
class SafetensorsFormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SafetensorsHeaderEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 1;
  int64_t data_begin = 0;  // byte offsets within the data section
  int64_t data_end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsHeaderEntry> entries;  // in data order
  std::map<std::string, std::string> metadata;  // user metadata: tandem.* keys removed
  // Set when the file carries tandem's checksums; crc32c[i] is entries[i]'s.
  bool has_crc32c = false;
  std::vector<uint32_t> crc32c;
};

// Checks the start of a file of `file_size` bytes and returns the header
// length N. `prefix` holds the file's first min(file_size, prefix_size)
// bytes; pass at least 9 when the file has them (byte 8 tells safetensors
// from pickle). Throws SafetensorsFormatError for a short file, a length
// over kSafetensorsMaxHeaderBytes or past the end of the file, and for
// pickle and zip (torch.save) files.
uint64_t parse_safetensors_header_length(const unsigned char* prefix, std::size_t prefix_size,
                                         uint64_t file_size);

// Parses and validates the N header bytes of a file whose data section holds
// `data_size` bytes (file size - 8 - N). Throws SafetensorsFormatError.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size);

// The N header bytes (JSON padded with spaces so that 8 + N is a multiple
// of 8) for `entries` in data order with their offsets set, user `metadata`
// (keys must not start with "tandem.") and one checksum per entry (zeros as
// placeholders: the length does not depend on them). Throws
// std::invalid_argument for names or metadata that are not valid UTF-8 and
// for reserved names.
std::string build_safetensors_header(const std::vector<SafetensorsHeaderEntry>& entries,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::vector<uint32_t>& crc32c);

// The bytes the __header__ checksum covers (see above).
std::string safetensors_layout_bytes(const std::vector<SafetensorsHeaderEntry>& entries,
                                     const std::map<std::string, std::string>& metadata);

}  // namespace tandem::detail
