// libFuzzer target: the HTTP answer parser of the MLflow client
// (src/core/http_answer.cpp) on whatever a server, or something posing as
// one, might send.
//
// The input is the bytes of the connection. Besides any sanitizer report,
// a bug is:
//   - a parse that does not end (libFuzzer's -timeout);
//   - a body longer than the bytes it came from;
//   - a prefix whose parse is done or an error while the whole input's
//     parse disagrees: bytes that come later can neither undo an answer
//     nor repair a malformed one;
//   - an open connection's answer that is done without being a complete
//     answer the closed connection also gives.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/http_answer.h"

namespace {

using tandem::detail::HttpAnswer;
using tandem::detail::parse_http_answer;

void check(bool condition) {
  if (!condition) std::abort();
}

bool same(const HttpAnswer& a, const HttpAnswer& b) {
  return a.state == b.state && a.status == b.status && a.body == b.body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  const std::string_view data(reinterpret_cast<const char*>(bytes), size);
  const HttpAnswer open = parse_http_answer(data, false);
  const HttpAnswer closed = parse_http_answer(data, true);
  check(closed.state != HttpAnswer::State::kNeedMore);
  for (const HttpAnswer* answer : {&open, &closed}) {
    check(answer->body.size() <= size);
    if (answer->state == HttpAnswer::State::kError) check(!answer->error.empty());
    if (answer->state == HttpAnswer::State::kDone) {
      check(answer->status >= 100 && answer->status <= 999);
    }
  }
  if (open.state != HttpAnswer::State::kNeedMore) {
    // What an open connection settles, its closing does not change (only an
    // answer framed by the close may still grow, and that one needs it).
    check(same(open, closed) || (open.state == HttpAnswer::State::kDone && closed.close));
  }
  // Prefixes: every one for short inputs, 64 for long ones.
  const std::size_t step = size <= 512 ? 1 : size / 64;
  for (std::size_t cut = 0; cut < size; cut += step) {
    const HttpAnswer part = parse_http_answer(data.substr(0, cut), false);
    if (part.state == HttpAnswer::State::kNeedMore) continue;
    check(same(part, open));
  }
  return 0;
}
