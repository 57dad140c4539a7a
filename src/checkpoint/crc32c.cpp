#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define TANDEM_CRC32C_X86 1
#endif

namespace tandem::detail {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // CRC-32C, reflected

using Table = std::array<std::array<uint32_t, 256>, 8>;

// table[k][b]: the CRC register after byte b followed by k zero bytes.
constexpr Table make_slicing_table() {
  Table table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kPolynomial & (0u - (crc & 1u)));
    table[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) {
      const uint32_t prev = table[k - 1][b];
      table[k][b] = (prev >> 8) ^ table[0][prev & 0xff];
    }
  }
  return table;
}

constexpr Table kTable = make_slicing_table();

uint64_t load_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // unaligned-safe; compiles to one load
  return v;
}

uint32_t portable_update(uint32_t crc, const unsigned char* p, std::size_t n) {
  while (n >= 8) {
    const uint64_t v = load_u64(p) ^ crc;  // little-endian hosts only (x86, arm64)
    crc = kTable[7][v & 0xff] ^ kTable[6][(v >> 8) & 0xff] ^ kTable[5][(v >> 16) & 0xff] ^
          kTable[4][(v >> 24) & 0xff] ^ kTable[3][(v >> 32) & 0xff] ^
          kTable[2][(v >> 40) & 0xff] ^ kTable[1][(v >> 48) & 0xff] ^ kTable[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kTable[0][(crc ^ *p++) & 0xff];
  return crc;
}

#ifdef TANDEM_CRC32C_X86

// The hardware path runs three independent crc32 chains (the instruction has
// a latency of 3 cycles and a throughput of 1) over three adjacent blocks,
// then merges them: crc(A || B) = shift(crc(A), |B|) ^ crc_from_zero(B),
// where shift() appends |B| zero bytes, a linear map applied by table.
constexpr std::size_t kLongBlock = 8192;
constexpr std::size_t kShortBlock = 256;

using ShiftTable = std::array<std::array<uint32_t, 256>, 4>;

uint32_t gf2_matrix_times(const uint32_t* matrix, uint32_t vector) {
  uint32_t sum = 0;
  for (; vector != 0; vector >>= 1, ++matrix) {
    if (vector & 1u) sum ^= *matrix;
  }
  return sum;
}

void gf2_matrix_square(uint32_t* square, const uint32_t* matrix) {
  for (int n = 0; n < 32; ++n) square[n] = gf2_matrix_times(matrix, matrix[n]);
}

// Tables applying `bytes` (a power of two) zero bytes to a CRC register.
ShiftTable make_shift_table(std::size_t bytes) {
  uint32_t odd[32];
  uint32_t even[32];
  odd[0] = kPolynomial;  // one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  gf2_matrix_square(even, odd);  // two zero bits
  gf2_matrix_square(odd, even);  // four zero bits
  const uint32_t* op = nullptr;
  for (;;) {  // squares alternate between the arrays: 1, 2, 4, ... bytes
    gf2_matrix_square(even, odd);
    bytes >>= 1;
    if (bytes == 0) {
      op = even;
      break;
    }
    gf2_matrix_square(odd, even);
    bytes >>= 1;
    if (bytes == 0) {
      op = odd;
      break;
    }
  }
  ShiftTable table{};
  for (uint32_t n = 0; n < 256; ++n) {
    for (int k = 0; k < 4; ++k) table[k][n] = gf2_matrix_times(op, n << (8 * k));
  }
  return table;
}

uint32_t shift(const ShiftTable& table, uint32_t crc) {
  return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^
         table[3][crc >> 24];
}

struct ShiftTables {
  ShiftTable long_block = make_shift_table(kLongBlock);
  ShiftTable short_block = make_shift_table(kShortBlock);
};

const ShiftTables& shift_tables() {
  static const ShiftTables tables;
  return tables;
}

template <std::size_t kBlock>
__attribute__((target("sse4.2"))) uint32_t hardware_blocks(uint32_t crc0, const unsigned char*& p,
                                                             std::size_t& n,
                                                             const ShiftTable& table) {
  while (n >= 3 * kBlock) {
    uint64_t crc1 = 0;
    uint64_t crc2 = 0;
    uint64_t c0 = crc0;
    for (std::size_t i = 0; i < kBlock; i += 8) {
      c0 = _mm_crc32_u64(c0, load_u64(p + i));
      crc1 = _mm_crc32_u64(crc1, load_u64(p + kBlock + i));
      crc2 = _mm_crc32_u64(crc2, load_u64(p + 2 * kBlock + i));
    }
    crc0 = shift(table, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(crc1);
    crc0 = shift(table, crc0) ^ static_cast<uint32_t>(crc2);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  return crc0;
}

__attribute__((target("sse4.2"))) uint32_t hardware_update(uint32_t crc, const unsigned char* p,
                                                             std::size_t n) {
  const ShiftTables& tables = shift_tables();
  crc = hardware_blocks<kLongBlock>(crc, p, n, tables.long_block);
  crc = hardware_blocks<kShortBlock>(crc, p, n, tables.short_block);
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, load_u64(p));
  crc = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) crc = _mm_crc32_u8(crc, *p);
  return crc;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

#endif  // TANDEM_CRC32C_X86

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, std::size_t size) {
  return ~portable_update(~crc, static_cast<const unsigned char*>(data), size);
}

uint32_t crc32c_extend(uint32_t crc, const void* data, std::size_t size) {
#ifdef TANDEM_CRC32C_X86
  if (cpu_has_sse42()) return ~hardware_update(~crc, static_cast<const unsigned char*>(data), size);
#endif
  return crc32c_extend_portable(crc, data, size);
}

bool crc32c_is_hardware_accelerated() {
#ifdef TANDEM_CRC32C_X86
  return cpu_has_sse42();
#else
  return false;
#endif
}

}  // namespace tandem::detail
