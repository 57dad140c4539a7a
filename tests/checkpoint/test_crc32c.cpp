// CRC-32C: the checksum over every checkpoint byte. The hardware path (three
// interleaved crc32 streams merged by shift tables) must equal the table
// path for every length and alignment.

#include "checkpoint/crc32c.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace tandem::detail {
namespace {

TEST(Crc32c, MatchesTheStandardCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c_extend_portable(0, "123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::vector<unsigned char> zeros(32, 0);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  const std::vector<unsigned char> ones(32, 0xff);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
}

TEST(Crc32c, HardwareAndTablePathsAgreeOnEveryLengthAndAlignment) {
  std::mt19937_64 rng(7);
  std::vector<unsigned char> buffer(200000);
  for (auto& b : buffer) b = static_cast<unsigned char>(rng());
  // Lengths around the 256- and 8192-byte block sizes of the 3-way path.
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n < 80; ++n) lengths.push_back(n);
  for (std::size_t base : {768u, 24576u, 3u * 8192u + 3u * 256u}) {
    for (std::size_t d = 0; d < 20; ++d) lengths.push_back(base - 10 + d);
  }
  for (int i = 0; i < 50; ++i) lengths.push_back(rng() % (buffer.size() - 16));
  for (std::size_t length : lengths) {
    for (std::size_t align = 0; align < 9; ++align) {
      const unsigned char* p = buffer.data() + align;
      EXPECT_EQ(crc32c(p, length), crc32c_extend_portable(0, p, length))
          << "length " << length << " align " << align;
    }
  }
}

TEST(Crc32c, ExtendComposesOverAnySplit) {
  std::mt19937_64 rng(11);
  std::string data(70000, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  const uint32_t whole = crc32c(data.data(), data.size());
  for (std::size_t split : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{30001},
                            data.size()}) {
    EXPECT_EQ(crc32c_extend(crc32c(data.data(), split), data.data() + split, data.size() - split),
              whole)
        << split;
  }
}

}  // namespace
}  // namespace tandem::detail
