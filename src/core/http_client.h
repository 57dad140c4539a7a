#pragma once
// A small HTTP/1.1 client over plain TCP, for the trackers that speak REST
// (MlflowWriter): one keep-alive connection, opened on the first request and
// reopened when the server closes it. http:// only: tandem links no TLS
// library. Private to libtandem. Not thread-safe.

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace tandem::detail {

struct HttpUrl {
  std::string host;       // a name, an IPv4 address or an IPv6 one without brackets
  int port = 80;
  std::string base_path;  // "" or "/prefix", without a trailing '/'

  // Parses "http://host[:port][/prefix]". UsageError naming `what` (the
  // variable or option the URL came from) for anything else, https included.
  static HttpUrl parse(const std::string& url, const std::string& what);
  std::string text() const;  // "http://host:port/prefix"
};

struct HttpResponse {
  int status = 0;     // the server's status; 0 when no answer came back
  std::string body;
  std::string error;  // status 0: why (connection refused, timed out, ...)
};

class HttpClient {
 public:
  using Headers = std::vector<std::pair<std::string, std::string>>;
  // `headers` go with every request (Authorization); `timeout` bounds each
  // request, connecting included.
  HttpClient(HttpUrl url, Headers headers, std::chrono::milliseconds timeout);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // METHOD base_path + `target` with a JSON body (none when empty). Never
  // throws for the network: a failure is a response with status 0. A kept
  // connection the server had closed is reopened once.
  HttpResponse request(const std::string& method, const std::string& target,
                       const std::string& json_body = "");
  const HttpUrl& url() const { return url_; }

 private:
  bool connect(std::chrono::steady_clock::time_point deadline, std::string& error);
  bool exchange(const std::string& request, std::chrono::steady_clock::time_point deadline,
                HttpResponse& response);
  void close();

  HttpUrl url_;
  Headers headers_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
};

// "a%20b": `text` as a URL query value (RFC 3986 unreserved kept).
std::string url_encode(const std::string& text);
// RFC 4648 base64, for HTTP Basic authentication.
std::string base64_encode(const std::string& bytes);

}  // namespace tandem::detail
