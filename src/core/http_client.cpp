// HttpClient (http_client.h): HTTP/1.1 requests on one kept TCP connection,
// with a deadline on every blocking step (poll), never a signal (SIGPIPE).

#include "core/http_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "core/tcp_connect.h"
#include "tandem/core/error.h"

namespace tandem::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Waits for `events` on `fd` until the deadline; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

HttpUrl HttpUrl::parse(const std::string& url, const std::string& what) {
  const std::string scheme = "http://";
  TANDEM_CHECK_ARG(url.compare(0, 8, "https://") != 0,
                   "{} '{}': tandem's HTTP client has no TLS. Point it at the tracking server "
                   "over plain http:// (for example through a local TLS-terminating proxy or "
                   "an ssh tunnel: ssh -L 5000:localhost:5000 host, then http://127.0.0.1:5000)",
                   what, url);
  TANDEM_CHECK_ARG(url.compare(0, scheme.size(), scheme) == 0 && url.size() > scheme.size(),
                   "{} '{}' is not an http:// URL. Give the tracking server's address, such as "
                   "http://127.0.0.1:5000 (start one with `mlflow server --host 127.0.0.1 "
                   "--port 5000`)",
                   what, url);
  HttpUrl out;
  std::string rest = url.substr(scheme.size());
  const auto slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) out.base_path = rest.substr(slash);
  while (!out.base_path.empty() && out.base_path.back() == '/') out.base_path.pop_back();
  TANDEM_CHECK_ARG(authority.find('@') == std::string::npos,
                   "{} '{}': credentials in the URL are not read; set MLFLOW_TRACKING_USERNAME "
                   "and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead",
                   what, url);
  std::string port;
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const auto close = authority.find(']');
    TANDEM_CHECK_ARG(close != std::string::npos, "{} '{}': unclosed '[' in the host", what, url);
    out.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') {
      port = authority.substr(close + 2);
    }
  } else {
    const auto colon = authority.find(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  TANDEM_CHECK_ARG(!out.host.empty(), "{} '{}' names no host", what, url);
  if (!port.empty()) {
    const bool digits = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](char c) {
                          return std::isdigit(static_cast<unsigned char>(c));
                        });
    out.port = digits ? std::stoi(port) : -1;
    TANDEM_CHECK_ARG(out.port >= 1 && out.port <= 65535,
                     "{} '{}': port '{}' is not a number from 1 to 65535", what, url, port);
  }
  return out;
}

std::string HttpUrl::text() const {
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}{}", v6 ? "[" : "", host, v6 ? "]" : "", port, base_path);
}

HttpClient::HttpClient(HttpUrl url, Headers headers, std::chrono::milliseconds timeout)
    : url_(std::move(url)), headers_(std::move(headers)), timeout_(timeout) {}

HttpClient::~HttpClient() { close(); }

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool HttpClient::connect(Clock::time_point deadline, std::string& error) {
  fd_ = connect_tcp(url_.host, url_.port, deadline, error);
  return fd_ >= 0;
}

HttpResponse HttpClient::request(const std::string& method, const std::string& target,
                                 const std::string& json_body) {
  std::string request = fmt::format("{} {}{} HTTP/1.1\r\nHost: {}:{}\r\n", method, url_.base_path,
                                    target, url_.host.find(':') != std::string::npos
                                                ? "[" + url_.host + "]" : url_.host,
                                    url_.port);
  request += "User-Agent: tandem\r\nAccept: application/json\r\nConnection: keep-alive\r\n";
  for (const auto& [name, value] : headers_) request += name + ": " + value + "\r\n";
  if (!json_body.empty() || method == "POST") {
    request += fmt::format("Content-Type: application/json\r\nContent-Length: {}\r\n",
                           json_body.size());
  }
  request += "\r\n" + json_body;
  const Clock::time_point deadline = Clock::now() + timeout_;
  HttpResponse response;
  // A kept connection may have been closed by the server since: one retry
  // on a fresh one when the old one gave nothing back.
  const bool reused = fd_ >= 0;
  if (exchange(request, deadline, response)) return response;
  if (reused && response.status == 0 && Clock::now() < deadline) {
    response = HttpResponse{};
    if (exchange(request, deadline, response)) return response;
  }
  return response;
}

bool HttpClient::exchange(const std::string& request, Clock::time_point deadline,
                          HttpResponse& response) {
  auto fail = [&](std::string why) {
    close();
    response.status = 0;
    response.error = std::move(why);
    return false;
  };
  if (fd_ < 0) {
    std::string error;
    if (!connect(deadline, error)) return fail(error);
  }
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd_, POLLOUT, deadline)) return fail("timed out sending the request");
    } else {
      return fail(fmt::format("sending failed: {}", std::strerror(errno)));
    }
  }
  std::string data;
  bool closed = false;
  // Reads more bytes into `data`; false at the deadline or on an error.
  auto read_more = [&]() {
    char buffer[16384];
    for (;;) {
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n > 0) {
        data.append(buffer, static_cast<std::size_t>(n));
        return true;
      }
      if (n == 0) {
        closed = true;
        return true;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN || !wait_for(fd_, POLLIN, deadline)) return false;
    }
  };
  std::size_t header_end;
  while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
    if (closed) return fail(data.empty() ? "the server closed the connection"
                                         : "the server closed the connection mid-answer");
    if (!read_more()) return fail("timed out waiting for the answer");
  }
  // "HTTP/1.1 200 OK", then "name: value" lines.
  const std::string head = data.substr(0, header_end);
  if (head.compare(0, 5, "HTTP/") != 0 || head.find(' ') == std::string::npos) {
    return fail("the answer is not HTTP: " + head.substr(0, 64));
  }
  const int status = std::atoi(head.c_str() + head.find(' ') + 1);
  std::map<std::string, std::string> fields;
  for (std::size_t at = head.find("\r\n"); at != std::string::npos;) {
    const std::size_t next = head.find("\r\n", at + 2);
    const std::string line = head.substr(at + 2, next == std::string::npos ? std::string::npos
                                                                           : next - at - 2);
    const auto colon = line.find(':');
    if (colon != std::string::npos) {
      const auto value_at = line.find_first_not_of(' ', colon + 1);
      fields[lower(line.substr(0, colon))] =
          value_at == std::string::npos ? "" : line.substr(value_at);
    }
    at = next;
  }
  std::string body = data.substr(header_end + 4);
  if (lower(fields["transfer-encoding"]).find("chunked") != std::string::npos) {
    // Chunks "<hex size>\r\n<bytes>\r\n", ending with size 0.
    std::string decoded;
    std::size_t at = 0;
    for (;;) {
      std::size_t line_end;
      while ((line_end = body.find("\r\n", at)) == std::string::npos) {
        if (closed || !read_more()) return fail("the chunked answer ended early");
        body = data.substr(header_end + 4);
      }
      const std::size_t size = std::strtoull(body.c_str() + at, nullptr, 16);
      while (body.size() < line_end + 2 + size + 2) {
        if (closed || !read_more()) return fail("the chunked answer ended early");
        body = data.substr(header_end + 4);
      }
      if (size == 0) break;
      decoded.append(body, line_end + 2, size);
      at = line_end + 2 + size + 2;
    }
    body = std::move(decoded);
  } else if (fields.count("content-length") != 0) {
    const std::size_t length = std::strtoull(fields["content-length"].c_str(), nullptr, 10);
    while (body.size() < length) {
      if (closed || !read_more()) return fail("the answer ended early");
      body = data.substr(header_end + 4);
    }
    body.resize(length);
  } else {
    while (!closed) {
      if (!read_more()) return fail("timed out reading the answer");
    }
    body = data.substr(header_end + 4);
    closed = true;
  }
  if (closed || lower(fields["connection"]) == "close") close();
  response.status = status;
  response.body = std::move(body);
  return true;
}

std::string url_encode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string base64_encode(const std::string& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace tandem::detail
