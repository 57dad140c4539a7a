#pragma once
// The bytes of a pickle as pickle_reader.cpp's machine reads them: opcode
// arguments (lengths, little-endian integers, big-endian floats, GLOBAL's
// lines), each read checked against the end of the data. Every error is a
// PickleFormatError naming the byte offset. LibTorch-free.

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "checkpoint/pickle_reader.h"

namespace tandem::detail {

template <typename... Args>
[[noreturn]] void pickle_fail(std::size_t at, fmt::format_string<Args...> f, Args&&... args) {
  throw PickleFormatError(
      fmt::format("pickle byte {}: {}", at, fmt::format(f, std::forward<Args>(args)...)));
}

class PickleInput {
 public:
  explicit PickleInput(std::string_view bytes) : in_(bytes) {}

  std::size_t pos() const { return pos_; }

  uint8_t byte() {
    if (pos_ >= in_.size()) pickle_fail(pos_, "the data ends before the pickle's STOP");
    return static_cast<uint8_t>(in_[pos_++]);
  }
  std::string_view take(uint64_t n) {
    if (n > in_.size() - pos_) {
      pickle_fail(pos_, "a length of {} runs past the end of the data", n);
    }
    std::string_view out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t unsigned_le(int bytes) {
    std::string_view b = take(bytes);
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[i]);
    return v;
  }
  // LONG1/LONG4's two's-complement integer of `n` bytes (at most 8).
  int64_t signed_le(uint64_t n) {
    if (n > 8) pickle_fail(pos_, "an integer of {} bytes (tandem reads up to 64 bits)", n);
    std::string_view b = take(n);
    uint64_t u = 0;
    for (int i = static_cast<int>(n) - 1; i >= 0; --i) u = (u << 8) | static_cast<uint8_t>(b[i]);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) u |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(u);
  }
  // BINFLOAT's IEEE double, big-endian.
  double float_be() {
    std::string_view b = take(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(b[i]);
    double out;
    std::memcpy(&out, &u, 8);
    return out;
  }
  // GLOBAL's module or name: the text up to the next newline.
  std::string line() {
    const std::size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos) pickle_fail(pos_, "a GLOBAL's name has no end of line");
    std::string out(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

 private:
  std::string_view in_;
  std::size_t pos_ = 0;
};

}  // namespace tandem::detail
