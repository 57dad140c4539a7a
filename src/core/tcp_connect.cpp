// connect_tcp (tcp_connect.h): a non-blocking connect to each resolved
// address, waited for with poll() up to the caller's deadline.
#include "core/tcp_connect.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace tandem::detail {

int poll_timeout_ms(std::chrono::steady_clock::time_point deadline) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

namespace {

// Waits for the non-blocking connect on `fd` to finish; 0 or its errno.
int finish_connect(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc == 0) return ETIMEDOUT;
    if (rc < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    return err;
  }
}

}  // namespace

int connect_tcp(const std::string& host, int port,
                std::chrono::steady_clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0) {
    error = fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc));
    return -1;
  }
  error = "no address";
  int connected = -1;
  for (addrinfo* ai = result; ai != nullptr && connected < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) err = finish_connect(fd, deadline);
    if (err == 0) {
      connected = fd;
    } else {
      error = std::strerror(err);
      ::close(fd);
    }
  }
  ::freeaddrinfo(result);
  return connected;
}

}  // namespace tandem::detail
