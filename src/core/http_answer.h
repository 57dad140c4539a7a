#pragma once
// The answer half of HTTP/1.1 for HttpClient (http_client.h): a status line,
// header fields, and a body framed by Content-Length, by chunks, or by the
// server closing the connection. Pure (no I/O, no LibTorch), so that it is
// fuzzed on its own (fuzz/fuzz_http_answer.cpp). Private to libtandem.

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::detail {

// An answer larger than this is refused (a tracking server's answers are
// small JSON documents).
inline constexpr std::size_t kMaxHttpAnswerBytes = std::size_t{64} << 20;

struct HttpAnswer {
  enum class State { kNeedMore, kDone, kError };
  State state = State::kNeedMore;
  int status = 0;
  std::string body;    // decoded (chunks joined)
  bool close = false;  // the connection cannot carry another request
  std::string error;   // kError: what is wrong with the bytes
};

// Parses `data`, every byte read from the connection so far. `closed`: the
// server has closed it, so no more will come (a partial answer is then an
// error, and an answer without a length ends there). kNeedMore asks for
// more bytes; the caller reads and calls again with all of them.
HttpAnswer parse_http_answer(std::string_view data, bool closed);

}  // namespace tandem::detail
