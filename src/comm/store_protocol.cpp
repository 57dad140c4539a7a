#include "comm/store_protocol.h"

namespace tandem::detail::store_wire {

const char* to_string(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kTimeout: return "timeout";
    case Status::kError: return "error";
    case Status::kRefused: return "refused";
    case Status::kBadRequest: return "bad request";
  }
  return "unknown status";
}

FrameWriter::FrameWriter() : buffer_(4, '\0') {}

FrameWriter& FrameWriter::u8(std::uint8_t value) {
  buffer_.push_back(static_cast<char>(value));
  return *this;
}

FrameWriter& FrameWriter::u32(std::uint32_t value) {
  for (int i = 0; i < 4; ++i) buffer_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return *this;
}

FrameWriter& FrameWriter::i64(std::int64_t value) {
  auto bits = static_cast<std::uint64_t>(value);
  for (int i = 0; i < 8; ++i) buffer_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  return *this;
}

FrameWriter& FrameWriter::bytes(std::string_view value) {
  u32(static_cast<std::uint32_t>(value.size()));
  buffer_.append(value.data(), value.size());
  return *this;
}

FrameWriter& FrameWriter::bytes(const std::vector<std::uint8_t>& value) {
  return bytes(std::string_view(reinterpret_cast<const char*>(value.data()), value.size()));
}

std::string FrameWriter::finish() {
  const auto size = static_cast<std::uint32_t>(buffer_.size() - 4);
  for (int i = 0; i < 4; ++i) buffer_[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  return std::move(buffer_);
}

bool FrameReader::take(std::size_t n) {
  if (!ok_ || body_.size() - pos_ < n) {
    ok_ = false;
    return false;
  }
  return true;
}

std::uint8_t FrameReader::u8() {
  if (!take(1)) return 0;
  return static_cast<std::uint8_t>(body_[pos_++]);
}

std::uint32_t FrameReader::u32() {
  if (!take(4)) return 0;
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(body_[pos_++])) << (8 * i);
  }
  return value;
}

std::int64_t FrameReader::i64() {
  if (!take(8)) return 0;
  std::uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) {
    bits |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(body_[pos_++])) << (8 * i);
  }
  return static_cast<std::int64_t>(bits);
}

std::string_view FrameReader::bytes(std::size_t max_size) {
  const std::uint32_t size = u32();
  if (!ok_ || size > max_size || !take(size)) {
    ok_ = false;
    return {};
  }
  std::string_view value = body_.substr(pos_, size);
  pos_ += size;
  return value;
}

FrameScan scan_frame(std::string_view buffer, std::size_t offset, std::size_t max_body,
                     std::string_view* body, std::size_t* frame_size) {
  if (buffer.size() < offset || buffer.size() - offset < 4) return FrameScan::kNeedMore;
  std::uint32_t size = 0;
  for (int i = 0; i < 4; ++i) {
    size |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(buffer[offset + i])) << (8 * i);
  }
  if (size > max_body) return FrameScan::kTooLarge;
  if (buffer.size() - offset - 4 < size) return FrameScan::kNeedMore;
  *body = buffer.substr(offset + 4, size);
  *frame_size = 4 + static_cast<std::size_t>(size);
  return FrameScan::kComplete;
}

bool tokens_equal(std::string_view expected, std::string_view presented) {
  // No early exit: the loop length and the work per byte do not depend on
  // where the first difference is, nor on the presented token's length.
  unsigned char diff = expected.size() == presented.size() ? 0 : 1;
  const std::size_t n = presented.size();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const unsigned char other = n == 0 ? 0 : static_cast<unsigned char>(presented[i % n]);
    diff |= static_cast<unsigned char>(expected[i]) ^ other;
  }
  volatile unsigned char result = diff;
  return result == 0;
}

}  // namespace tandem::detail::store_wire
