// HttpClient (http_client.h): HTTP/1.1 requests on one kept TCP connection,
// with a deadline on every blocking step (poll), never a signal (SIGPIPE).

#include "core/http_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/http_answer.h"
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
  char buffer[16384];
  for (;;) {
    HttpAnswer answer = parse_http_answer(data, closed);
    if (answer.state == HttpAnswer::State::kError) return fail(answer.error);
    if (answer.state == HttpAnswer::State::kDone) {
      if (answer.close) close();
      response.status = answer.status;
      response.body = std::move(answer.body);
      return true;
    }
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n > 0) {
      data.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0) {
      closed = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN) {
      return fail(fmt::format("reading the answer failed: {}", std::strerror(errno)));
    } else if (!wait_for(fd_, POLLIN, deadline)) {
      return fail(data.empty() ? "timed out waiting for the answer"
                               : "timed out reading the answer");
    }
  }
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
