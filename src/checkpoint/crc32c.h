#pragma once
// CRC-32C (Castagnoli), the checksum of every tensor tandem writes.
//
// Torch-free (the fuzz targets build it without LibTorch). Uses the SSE4.2
// crc32 instruction over three interleaved streams when the CPU has it
// (~15-20 GB/s), and a slicing-by-8 table otherwise (~1.5 GB/s).
// All functions are thread-safe.

#include <cstddef>
#include <cstdint>

namespace tandem::detail {

// The CRC-32C of `data` appended to bytes whose CRC-32C is `crc`:
// crc32c_extend(crc32c_extend(0, a), b) == crc32c(a + b). Start with 0.
uint32_t crc32c_extend(uint32_t crc, const void* data, std::size_t size);

inline uint32_t crc32c(const void* data, std::size_t size) { return crc32c_extend(0, data, size); }

// The table implementation, whatever the CPU: the reference the hardware
// path is tested and fuzzed against.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, std::size_t size);

// Whether crc32c_extend() uses the SSE4.2 instruction on this CPU.
bool crc32c_is_hardware_accelerated();

}  // namespace tandem::detail
