#pragma once
// A loopback TCP port held for one test, without the "bind to 0, close,
// reuse later" race: the socket stays bound (never listening) until the
// object goes, so no other socket on the machine is handed the port in the
// meantime, neither by another test's bind to port 0 (ctest -j) nor as a
// connection's source port. Connecting to it is refused until a server
// listens on it.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace tandem::testing {

class ReservedPort {
 public:
  // With `shareable`, a server that sets SO_REUSEADDR (tandem's store does)
  // may still bind and listen on the port: Linux allows that while this
  // socket does not listen. Without it, nobody else can bind the port.
  explicit ReservedPort(bool shareable) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    int one = 1;
    if (shareable) ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~ReservedPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  // 0 if no port could be reserved.
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace tandem::testing
