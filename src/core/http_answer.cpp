// parse_http_answer (http_answer.h). Every size read from the bytes is
// checked before it is added to an offset, so that no value a server sends
// can wrap an offset around and make the parse loop or read out of bounds.
#include "core/http_answer.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <map>

namespace tandem::detail {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// A whole unsigned number in `text` (base 10 or 16), at most `limit`.
bool parse_size(std::string_view text, int base, std::size_t limit, std::size_t& value) {
  std::uint64_t parsed = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed, base);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || parsed > limit) {
    return false;
  }
  value = static_cast<std::size_t>(parsed);
  return true;
}

std::string shown(std::string_view bytes) {
  std::string out;
  for (char c : bytes.substr(0, 64)) {
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  return out;
}

}  // namespace

HttpAnswer parse_http_answer(std::string_view data, bool closed) {
  HttpAnswer answer;
  auto error = [&](std::string why) {
    answer.state = HttpAnswer::State::kError;
    answer.error = std::move(why);
    return answer;
  };
  auto need_more = [&](const char* if_closed) {
    return closed ? error(if_closed) : answer;
  };
  if (data.size() > kMaxHttpAnswerBytes) {
    return error("the answer is larger than " + std::to_string(kMaxHttpAnswerBytes >> 20) +
                 " MiB");
  }
  const std::size_t header_end = data.find("\r\n\r\n");
  if (header_end == std::string_view::npos) {
    return need_more(data.empty() ? "the server closed the connection"
                                  : "the server closed the connection mid-answer");
  }
  // "HTTP/1.1 200 OK", then "name: value" lines.
  const std::string_view head = data.substr(0, header_end);
  const std::size_t line_end = std::min(head.find("\r\n"), head.size());
  const std::string_view status_line = head.substr(0, line_end);
  const std::size_t space = status_line.find(' ');
  std::size_t status = 0;
  if (status_line.rfind("HTTP/", 0) != 0 || space == std::string_view::npos ||
      status_line.size() < space + 4 ||
      !parse_size(status_line.substr(space + 1, 3), 10, 999, status) || status < 100) {
    return error("the answer is not HTTP: " + shown(head));
  }
  answer.status = static_cast<int>(status);
  std::map<std::string, std::string> fields;
  for (std::size_t at = line_end; at < head.size();) {
    const std::size_t next = std::min(head.find("\r\n", at + 2), head.size());
    const std::string_view line = head.substr(at + 2, next - std::min(next, at + 2));
    const std::size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      fields[lower(trim(line.substr(0, colon)))] = std::string(trim(line.substr(colon + 1)));
    }
    at = next;
  }
  const std::string_view body = data.substr(header_end + 4);
  if (lower(fields["transfer-encoding"]).find("chunked") != std::string::npos) {
    // Chunks "<hex size>[;extension]\r\n<bytes>\r\n", the last of size 0.
    for (std::size_t at = 0;;) {
      const std::size_t size_end = body.find("\r\n", at);
      if (size_end == std::string_view::npos) return need_more("the chunked answer ended early");
      std::string_view size_text = body.substr(at, size_end - at);
      size_text = trim(size_text.substr(0, size_text.find(';')));
      std::size_t size = 0;
      if (!parse_size(size_text, 16, kMaxHttpAnswerBytes, size)) {
        return error("the chunked answer has a bad chunk size: " + shown(size_text));
      }
      const std::size_t data_at = size_end + 2;
      if (body.size() - data_at < size + 2) return need_more("the chunked answer ended early");
      if (body.substr(data_at + size, 2) != "\r\n") {
        return error("the chunked answer has a chunk without its closing CRLF");
      }
      if (size == 0) break;
      answer.body.append(body.substr(data_at, size));
      at = data_at + size + 2;
    }
  } else if (fields.count("content-length") != 0) {
    std::size_t length = 0;
    if (!parse_size(fields["content-length"], 10, kMaxHttpAnswerBytes, length)) {
      return error("the answer has a bad Content-Length: " + shown(fields["content-length"]));
    }
    if (body.size() < length) return need_more("the answer ended early");
    answer.body = std::string(body.substr(0, length));
  } else {
    if (!closed) return answer;  // the body ends when the server closes
    answer.body = std::string(body);
  }
  answer.close = closed || lower(fields["connection"]) == "close";
  answer.state = HttpAnswer::State::kDone;
  return answer;
}

}  // namespace tandem::detail
