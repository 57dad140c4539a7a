#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors_header_json.h"

namespace tandem::detail {
namespace {

struct DtypeInfo {
  const char* name;
  SafetensorsDtype dtype;
  int64_t size;
};

// In SafetensorsDtype's order: info() indexes it.
constexpr DtypeInfo kDtypes[] = {
    {"F64", SafetensorsDtype::kF64, 8},
    {"F32", SafetensorsDtype::kF32, 4},
    {"F16", SafetensorsDtype::kF16, 2},
    {"BF16", SafetensorsDtype::kBF16, 2},
    {"I64", SafetensorsDtype::kI64, 8},
    {"I32", SafetensorsDtype::kI32, 4},
    {"I16", SafetensorsDtype::kI16, 2},
    {"I8", SafetensorsDtype::kI8, 1},
    {"U8", SafetensorsDtype::kU8, 1},
    {"BOOL", SafetensorsDtype::kBool, 1},
    {"U64", SafetensorsDtype::kU64, 8},
    {"U32", SafetensorsDtype::kU32, 4},
    {"U16", SafetensorsDtype::kU16, 2},
    {"F8_E4M3", SafetensorsDtype::kF8E4M3, 1},
    {"F8_E5M2", SafetensorsDtype::kF8E5M2, 1},
    {"F8_E4M3FNUZ", SafetensorsDtype::kF8E4M3Fnuz, 1},
    {"F8_E5M2FNUZ", SafetensorsDtype::kF8E5M2Fnuz, 1},
    {"F8_E8M0", SafetensorsDtype::kF8E8M0, 1},
};

// Valid in the safetensors format, but with no LibTorch type to read into
// (F4 and F6 count 4- and 6-bit elements; torch's float4_e2m1fn_x2 packs
// two) or not read yet (C64).
constexpr const char* kUnsupportedDtypes[] = {"F6_E2M3", "F6_E3M2", "F4", "C64", "E8M0"};

// "F64 F32 ... F8_E8M0", for messages.
std::string dtype_list() {
  std::string out;
  for (const auto& d : kDtypes) out += (out.empty() ? "" : " ") + std::string(d.name);
  return out;
}

constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < std::size(kDtypes); ++i) {
    if (static_cast<std::size_t>(kDtypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(in_enum_order(), "kDtypes must list SafetensorsDtype in order");

const DtypeInfo& info(SafetensorsDtype dtype) { return kDtypes[static_cast<int>(dtype)]; }

[[noreturn]] void fail(const std::string& message) { throw SafetensorsFormatError(message); }

std::string shown(const std::string& s) {
  // Names come from the file: keep messages printable and short.
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < 200; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) || c >= 0x80 ? static_cast<char>(c) : '?';
  }
  if (s.size() > 200) out += "...";
  return out + "'";
}

SafetensorsDtype parse_dtype(const std::string& tensor, const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  for (const char* u : kUnsupportedDtypes) {
    if (name == u) {
      fail("tensor " + shown(tensor) + " has dtype " + name +
           ", a valid safetensors dtype that tandem does not read yet; convert it to one "
           "of " + dtype_list() + " before saving");
    }
  }
  fail("tensor " + shown(tensor) + " has unknown dtype " + shown(name) + " (expected " +
       dtype_list() + "): the file is corrupt or was written by a newer safetensors version");
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void append_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool data_order_less(const SafetensorsHeaderEntry& a, const SafetensorsHeaderEntry& b) {
  return std::tie(a.data_begin, a.data_end, a.name) < std::tie(b.data_begin, b.data_end, b.name);
}

std::string hex8(uint32_t v) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 0xf];
  return s;
}

bool parse_hex8(const std::string& s, uint32_t& out) {
  if (s.size() != 8) return false;
  out = 0;
  for (char c : s) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;  // uppercase too: the writer's form is fixed, so anything else is damage
    }
    out = (out << 4) | static_cast<uint32_t>(digit);
  }
  return true;
}

// numel and byte size, rejecting shapes whose sizes overflow int64 (also
// when a zero dimension would hide the overflow: LibTorch would refuse them).
void compute_sizes(SafetensorsHeaderEntry& e, int64_t elem_size, int64_t& bytes) {
  int64_t numel = 1;
  int64_t nonzero = 1;
  for (int64_t d : e.shape) {
    if (__builtin_mul_overflow(nonzero, std::max<int64_t>(d, 1), &nonzero) ||
        __builtin_mul_overflow(numel, d, &numel)) {
      fail("tensor " + shown(e.name) + " has a shape whose size overflows 64 bits: the file is corrupt");
    }
  }
  if (__builtin_mul_overflow(nonzero, elem_size, &bytes)) {
    fail("tensor " + shown(e.name) + " has a byte size that overflows 64 bits: the file is corrupt");
  }
  e.numel = numel;
  bytes = numel * elem_size;
}

void check_tiling(std::vector<SafetensorsHeaderEntry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), data_order_less);
  int64_t expected = 0;
  const SafetensorsHeaderEntry* previous = nullptr;
  for (const auto& e : entries) {
    if (e.data_begin < expected) {
      fail("tensors " + shown(previous->name) + " and " + shown(e.name) +
           " overlap in the data section: the file is corrupt");
    }
    if (e.data_begin > expected) {
      fail("the data section has a hole of " + std::to_string(e.data_begin - expected) +
           " bytes before tensor " + shown(e.name) +
           " (entries must tile the data section): the file is corrupt");
    }
    expected = e.data_end;
    previous = &e;
  }
  if (static_cast<uint64_t>(expected) != data_size) {
    fail("the data section holds " + std::to_string(data_size) + " bytes but the tensors cover " +
         std::to_string(expected) +
         ": trailing bytes after the last tensor, so the file is corrupt or was appended to");
  }
}

bool one_bit_apart(const std::string& a, const char* b) {
  if (a.size() != std::strlen(b)) return false;
  int bits = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bits += __builtin_popcount(static_cast<unsigned char>(a[i] ^ b[i]));
  }
  return bits == 1;
}

// Moves tandem.* keys out of `header.metadata` and checks the checksums of
// the layout; the data checksums are left for the reader.
void take_checksums(SafetensorsHeader& header) {
  std::string crc_json;
  bool has_crc = false;
  for (auto it = header.metadata.begin(); it != header.metadata.end();) {
    if (one_bit_apart(it->first, kCrcMetadataKey)) {
      fail("the metadata key " + shown(it->first) + " is one bit away from '" +
           kCrcMetadataKey + "': the header is corrupt");
    }
    if (it->first.rfind("tandem.", 0) != 0) {
      ++it;
      continue;
    }
    if (it->first == kCrcMetadataKey) {
      crc_json = it->second;
      has_crc = true;
    }
    it = header.metadata.erase(it);  // unknown tandem.* keys: a newer writer's
  }
  if (!has_crc) return;
  const std::map<std::string, std::string> crcs = parse_string_map(crc_json, kCrcMetadataKey);
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < header.entries.size(); ++i) index[header.entries[i].name] = i;
  header.crc32c.assign(header.entries.size(), 0);
  std::vector<bool> seen(header.entries.size(), false);
  bool has_layout_crc = false;
  uint32_t layout_crc = 0;
  for (const auto& [name, hex] : crcs) {
    uint32_t value = 0;
    if (!parse_hex8(hex, value)) {
      fail(std::string("the ") + kCrcMetadataKey + " checksum of " + shown(name) + " is " +
           shown(hex) + ", not 8 lowercase hex digits: the header is corrupt");
    }
    if (name == kHeaderCrcName) {
      has_layout_crc = true;
      layout_crc = value;
      continue;
    }
    const auto it = index.find(name);
    if (it == index.end()) {
      fail(std::string(kCrcMetadataKey) + " has a checksum for tensor " + shown(name) +
           ", which the file does not hold: the header is corrupt");
    }
    header.crc32c[it->second] = value;
    seen[it->second] = true;
  }
  for (std::size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) {
      fail(std::string(kCrcMetadataKey) + " has no checksum for tensor " +
           shown(header.entries[i].name) + ": the header is corrupt");
    }
  }
  if (!has_layout_crc) {
    fail(std::string(kCrcMetadataKey) + " has no '" + kHeaderCrcName + "' checksum: the header is corrupt");
  }
  const std::string layout = safetensors_layout_bytes(header.entries, header.metadata);
  if (crc32c(layout.data(), layout.size()) != layout_crc) {
    fail("the header's checksum does not match its contents (names, dtypes, shapes, offsets or "
         "metadata changed): the file is corrupt (bit flip or partial write)");
  }
  header.has_crc32c = true;
}

}  // namespace

const char* safetensors_dtype_string(SafetensorsDtype dtype) { return info(dtype).name; }
int64_t safetensors_dtype_size(SafetensorsDtype dtype) { return info(dtype).size; }

uint64_t parse_safetensors_header_length(const unsigned char* prefix, std::size_t prefix_size,
                                         uint64_t file_size) {
  const std::size_t have = static_cast<std::size_t>(std::min<uint64_t>(prefix_size, file_size));
  const bool pickle = have >= 2 && prefix[0] == 0x80 && prefix[1] >= 2 && prefix[1] <= 5;
  const bool zip = have >= 4 && std::memcmp(prefix, "PK\x03\x04", 4) == 0;
  const std::string pickle_message =
      "this is a pickle/torch.save file, not safetensors; tandem loads no pickle directly "
      "(loading one can run arbitrary code). Convert it once with `tandem checkpoint import "
      "FILE OUT.safetensors` (weights only: it builds tensors and numbers and executes "
      "nothing), or in Python with "
      "`safetensors.torch.save_file(torch.load(path), 'out.safetensors')`";
  if (file_size < 8 || have < 8) {
    if (pickle || zip) fail(pickle_message);
    fail("the file is only " + std::to_string(file_size) +
         " bytes; a safetensors file starts with an 8-byte header length. It is truncated (an "
         "interrupted write?) or not a safetensors file: write it again");
  }
  const uint64_t n = read_le64(prefix);
  const bool plausible = n <= kSafetensorsMaxHeaderBytes && n <= file_size - 8 &&
                         (have < 9 || n == 0 || prefix[8] == '{');
  if (!plausible && (pickle || zip)) fail(pickle_message);
  if (n > kSafetensorsMaxHeaderBytes) {
    fail("the header length field says " + std::to_string(n) + " bytes, over the " +
         std::to_string(kSafetensorsMaxHeaderBytes) +
         "-byte limit: the file is corrupt or not a safetensors file");
  }
  if (n > file_size - 8) {
    fail("the header length field says " + std::to_string(n) + " bytes but only " +
         std::to_string(file_size - 8) +
         " follow it: the file is truncated or corrupt; write it again");
  }
  if (n < 2) {
    fail("the header is " + std::to_string(n) +
         " bytes, too short for a JSON object: the file was never completed (tandem writes the "
         "header last) or is not a safetensors file; write it again");
  }
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size) {
  if (json.empty() || json.front() != '{') {
    fail("the header does not start with '{': the file is corrupt or not a safetensors file");
  }
  // JSON text never holds a raw NUL, and nlohmann's lexer would take one
  // for the end of the input, accepting whatever follows it.
  if (json.find('\0') != std::string_view::npos) {
    fail("the header holds a NUL byte at offset " + std::to_string(json.find('\0')) +
         ": the file is corrupt");
  }
  RawHeader raw = parse_header_json(json);
  SafetensorsHeader header;
  header.metadata = std::move(raw.metadata);
  header.entries.reserve(raw.entries.size());
  for (auto& r : raw.entries) {
    SafetensorsHeaderEntry e;
    e.name = std::move(r.name);
    e.dtype = parse_dtype(e.name, r.dtype);
    e.shape = std::move(r.shape);
    e.data_begin = r.data_begin;
    e.data_end = r.data_end;
    int64_t bytes = 0;
    compute_sizes(e, info(e.dtype).size, bytes);
    if (e.data_begin > e.data_end) {
      fail("tensor " + shown(e.name) + " has data_offsets [" + std::to_string(e.data_begin) +
           ", " + std::to_string(e.data_end) + "] with begin > end: the file is corrupt");
    }
    if (e.data_end - e.data_begin != bytes) {
      fail("tensor " + shown(e.name) + " (" + info(e.dtype).name + ", " +
           std::to_string(e.numel) + " elements) needs " + std::to_string(bytes) +
           " bytes but its data_offsets span " + std::to_string(e.data_end - e.data_begin) +
           ": the file is corrupt");
    }
    if (static_cast<uint64_t>(e.data_end) > data_size) {
      fail("tensor " + shown(e.name) + " ends at byte " + std::to_string(e.data_end) +
           " of a data section of " + std::to_string(data_size) +
           " bytes: the file is truncated; write it again");
    }
    header.entries.push_back(std::move(e));
  }
  check_tiling(header.entries, data_size);
  take_checksums(header);
  return header;
}

std::string safetensors_layout_bytes(const std::vector<SafetensorsHeaderEntry>& entries,
                                     const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsHeaderEntry*> order;
  order.reserve(entries.size());
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return data_order_less(*a, *b); });
  // Length-prefixed fields: unambiguous whatever bytes the names hold.
  std::string out;
  append_u64(out, order.size());
  for (const auto* e : order) {
    append_u64(out, e->name.size());
    out += e->name;
    const char* dtype = info(e->dtype).name;
    append_u64(out, std::strlen(dtype));
    out += dtype;
    append_u64(out, e->shape.size());
    for (int64_t d : e->shape) append_u64(out, static_cast<uint64_t>(d));
    append_u64(out, static_cast<uint64_t>(e->data_begin));
    append_u64(out, static_cast<uint64_t>(e->data_end));
  }
  append_u64(out, metadata.size());
  for (const auto& [key, value] : metadata) {
    append_u64(out, key.size());
    out += key;
    append_u64(out, value.size());
    out += value;
  }
  return out;
}

std::string build_safetensors_header(const std::vector<SafetensorsHeaderEntry>& entries,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::vector<uint32_t>& crc32c) {
  if (crc32c.size() != entries.size()) {
    throw std::invalid_argument("build_safetensors_header: one checksum per entry");
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [key, value] : metadata) {
    if (key.rfind("tandem.", 0) == 0 || one_bit_apart(key, kCrcMetadataKey)) {
      throw std::invalid_argument("metadata key " + shown(key) +
                                  " is reserved: keys starting with 'tandem.' are tandem's own");
    }
    meta[key] = value;
  }
  const std::string layout = safetensors_layout_bytes(entries, metadata);
  // Written by hand rather than through a json object: a json object would
  // sort the entries by name, and an ordered one finds keys in linear time.
  std::string crcs = std::string("{\"") + kHeaderCrcName + "\":\"" +
                     hex8(detail::crc32c(layout.data(), layout.size())) + "\"";
  std::string tensors;
  std::unordered_map<std::string_view, bool> names;
  try {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      if (e.name == "__metadata__" || e.name == kHeaderCrcName) {
        throw std::invalid_argument("tensor name " + shown(e.name) + " is reserved");
      }
      if (!names.emplace(e.name, true).second) {
        throw std::invalid_argument("tensor name " + shown(e.name) + " appears twice");
      }
      const std::string name = nlohmann::json(e.name).dump();
      crcs += "," + name + ":\"" + hex8(crc32c[i]) + "\"";
      tensors += "," + name + ":" +
                 nlohmann::json{{"dtype", info(e.dtype).name},
                                {"shape", e.shape},
                                {"data_offsets", {e.data_begin, e.data_end}}}
                     .dump();
    }
    meta[kCrcMetadataKey] = crcs + "}";
    std::string text = "{\"__metadata__\":" + meta.dump() + tensors + "}";
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');
    return text;
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(
        "a tensor name or metadata string is not valid UTF-8; safetensors headers are UTF-8 JSON");
  }
}

}  // namespace tandem::detail
