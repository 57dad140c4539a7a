// parse_http_answer (src/core/http_answer.h), the MLflow client's answer
// parser, on whole answers, answers arriving in pieces, and bytes no server
// should send. fuzz/fuzz_http_answer.cpp checks the same rules on random
// bytes.

#include <gtest/gtest.h>

#include <string>

#include "core/http_answer.h"

namespace tandem::detail {
namespace {

using State = HttpAnswer::State;

// Every prefix of `bytes` on an open connection asks for more, and the
// whole of it gives what the parse of the whole gives.
HttpAnswer parse_in_pieces(const std::string& bytes, bool closed) {
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    const HttpAnswer part = parse_http_answer(std::string_view(bytes).substr(0, cut), false);
    EXPECT_EQ(part.state, State::kNeedMore) << "at byte " << cut << ": " << part.error;
  }
  return parse_http_answer(bytes, closed);
}

TEST(HttpAnswer, ContentLengthChunkedAndCloseFramedBodiesReadWhole) {
  HttpAnswer a = parse_in_pieces(
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length:  7 \r\n\r\n{\"a\":1}",
      false);
  EXPECT_EQ(a.state, State::kDone);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "{\"a\":1}");
  EXPECT_FALSE(a.close);

  a = parse_in_pieces(
      "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
      "5;name=value\r\nhello\r\nA\r\n, world!!!\r\n0\r\n\r\n",
      false);
  EXPECT_EQ(a.state, State::kDone);
  EXPECT_EQ(a.status, 201);
  EXPECT_EQ(a.body, "hello, world!!!");
  EXPECT_TRUE(a.close);

  // No length: the body ends when the server closes.
  const std::string framed = "HTTP/1.0 503 Service Unavailable\r\n\r\n<html>busy</html>";
  EXPECT_EQ(parse_http_answer(framed, false).state, State::kNeedMore);
  a = parse_http_answer(framed, true);
  EXPECT_EQ(a.state, State::kDone);
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.body, "<html>busy</html>");
  EXPECT_TRUE(a.close);
}

TEST(HttpAnswer, AConnectionClosedMidAnswerSaysWhere) {
  EXPECT_EQ(parse_http_answer("", true).error, "the server closed the connection");
  EXPECT_EQ(parse_http_answer("HTTP/1.1 200 OK\r\n", true).error,
            "the server closed the connection mid-answer");
  EXPECT_EQ(parse_http_answer("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", true).error,
            "the answer ended early");
  EXPECT_EQ(
      parse_http_answer("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", true)
          .error,
      "the chunked answer ended early");
}

TEST(HttpAnswer, MalformedAnswersAreErrorsNamingWhatIsWrong) {
  auto error_of = [](const std::string& bytes) {
    const HttpAnswer a = parse_http_answer(bytes, false);
    EXPECT_EQ(a.state, State::kError) << bytes;
    return a.error;
  };
  EXPECT_EQ(error_of("SSH-2.0-OpenSSH_9.2\r\n\r\n"), "the answer is not HTTP: SSH-2.0-OpenSSH_9.2");
  EXPECT_EQ(error_of("HTTP/1.1 OK\r\n\r\n").rfind("the answer is not HTTP", 0), 0u);
  EXPECT_EQ(error_of("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
            "the answer has a bad Content-Length: -1");
  EXPECT_EQ(error_of("HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"),
            "the answer has a bad Content-Length: 99999999999");
  // 2^64 - 20: the parser before this one added it to its offset, which
  // wrapped back to the same size line, and looped for ever, appending the
  // rest of the answer to the body at each turn.
  EXPECT_EQ(error_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "ffffffffffffffec\r\nab\r\n0\r\n\r\n"),
            "the chunked answer has a bad chunk size: ffffffffffffffec");
  EXPECT_EQ(error_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            "the chunked answer has a bad chunk size: zz");
  EXPECT_EQ(error_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n"),
            "the chunked answer has a chunk without its closing CRLF");
  const std::string huge(kMaxHttpAnswerBytes + 1, 'x');
  EXPECT_EQ(error_of(huge), "the answer is larger than 64 MiB");
}

TEST(HttpAnswer, BytesAfterACompleteAnswerDoNotChangeIt) {
  const std::string one = "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n";
  const HttpAnswer a = parse_http_answer(one + "HTTP/1.1 500 Oops\r\n\r\n", false);
  EXPECT_EQ(a.state, State::kDone);
  EXPECT_EQ(a.status, 204);
  EXPECT_EQ(a.body, "");
}

}  // namespace
}  // namespace tandem::detail
