#pragma once
// Wire format of tandem's rendezvous store (StoreServer <-> TokenStore).
//
// A client opens with the 4 bytes kMagic, then sends frames; the server
// answers each request frame with one reply frame, in order.
//   frame   = u32 body_length (little-endian) + body
//   request = u8 Op + fields      reply = u8 Status + fields
//   fields  : bytes = u32 length + data; i64 = 8 bytes little-endian
// The first frame must be kHello(u32 version, bytes token[, bytes run_scope]):
// a store with a run scope refuses a client that names another one
// (kOtherRunPrefix + the store's scope). Lengths are
// capped (kMaxHelloBytes before the hello is accepted, kMaxFrameBytes after)
// so that no input can make the server allocate without bound.
//
// Torch-free on purpose: the fuzz target builds it with clang alone.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::detail::store_wire {

// Not a c10d TCPStore query type, so a TCPStore server drops a tandem client
// at once (and a TCPStore client is refused here at once).
inline constexpr char kMagic[4] = {'T', 'N', 'D', 'S'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kMaxHelloBytes = 1024;
// How a refused hello's message starts when the client belongs to another
// run than the store; the store's own run scope follows.
inline constexpr char kOtherRunPrefix[] = "the store belongs to run ";
inline constexpr std::size_t kMaxFrameBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxKeyBytes = 64 * 1024;
inline constexpr std::size_t kMaxKeysPerRequest = 64 * 1024;

enum class Op : std::uint8_t {
  kHello = 1,
  kSet = 2,         // key, value
  kGet = 3,         // key, i64 timeout_ms (0: none) -> value once the key exists
  kAdd = 4,         // key, i64 delta -> i64 sum (stored as decimal text)
  kCompareSet = 5,  // key, expected, desired -> the value now stored
  kCheck = 6,       // u32 n, n keys -> u8 all present
  kWait = 7,        // u32 n, n keys, i64 timeout_ms -> once all exist
  kDeleteKey = 8,   // key -> u8 deleted
  kNumKeys = 9,     // -> i64
};

enum class Status : std::uint8_t {
  kOk = 0,
  kTimeout = 1,     // a get/wait deadline passed
  kError = 2,       // request well-formed but not possible (message follows)
  kRefused = 3,     // bad magic, version or token; the server closes
  kBadRequest = 4,  // malformed frame; the server closes
};

const char* to_string(Status status);

// Appends fields to a frame and writes its length prefix.
class FrameWriter {
 public:
  FrameWriter();
  FrameWriter& u8(std::uint8_t value);
  FrameWriter& u32(std::uint32_t value);
  FrameWriter& i64(std::int64_t value);
  FrameWriter& bytes(std::string_view value);
  FrameWriter& bytes(const std::vector<std::uint8_t>& value);
  // The finished frame, length prefix included; call once, last.
  std::string finish();

 private:
  std::string buffer_;
};

// Reads fields from one frame body. Every read checks bounds; after the
// first failure ok() is false and all reads return empty values.
class FrameReader {
 public:
  explicit FrameReader(std::string_view body) : body_(body) {}
  std::uint8_t u8();
  std::uint32_t u32();
  std::int64_t i64();
  // A length-prefixed field of at most `max_size` bytes.
  std::string_view bytes(std::size_t max_size);
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && pos_ == body_.size(); }

 private:
  bool take(std::size_t n);
  std::string_view body_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// Result of looking for one frame at the front of a buffer.
enum class FrameScan { kNeedMore, kComplete, kTooLarge };

// Looks at `buffer` from `offset`: when a whole frame of at most `max_body`
// bytes is there, sets `body` to it and `frame_size` to its size with the
// prefix. kTooLarge as soon as the prefix announces more than `max_body`.
FrameScan scan_frame(std::string_view buffer, std::size_t offset, std::size_t max_body,
                     std::string_view* body, std::size_t* frame_size);

// Equal tokens, in time that depends only on `expected`'s length.
bool tokens_equal(std::string_view expected, std::string_view presented);

}  // namespace tandem::detail::store_wire
