#include "tandem/comm/c10d_store_host.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/torch_compat.h"
#include "tandem/comm/store_server.h"
#include "tandem/core/error.h"

namespace tandem {

struct C10dStoreHost::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

namespace {

// A listening TCP socket on host:port; returns the fd and sets `bound_port`.
int listen_on(const std::string& host, int port, int& bound_port, const std::string& advice) {
  // c10d's store has no authentication: never on every interface at once.
  TANDEM_CHECK_ARG(!is_wildcard_host(host),
                   "the c10d store listens on one address, not '{}' (every interface), since "
                   "c10d's store protocol has no token: give node 0's own address "
                   "(MASTER_ADDR, --master-addr), or 127.0.0.1 for a single node",
                   host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  TANDEM_CHECK_ARG(rc == 0, "c10d store: cannot resolve {}: {}", host,
                   ::gai_strerror(rc));
  int fd = -1;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  // As tandem's own store (store_server.cpp): the machine's state, not the
  // flags, is at fault, so a CommError (the launcher exits 1, not 2).
  if (fd < 0 && error == EADDRINUSE) {
    TANDEM_THROW(CommError,
                 "cannot host the rendezvous store on {} port {}: the port is already in use, "
                 "probably by another job; {}",
                 host, port,
                 advice.empty() ? "pick another MASTER_PORT, the same for every rank" : advice);
  }
  if (fd < 0 && error == EADDRNOTAVAIL) {
    TANDEM_THROW(CommError,
                 "cannot host the c10d store on {}: it is not an address of this machine. "
                 "MASTER_ADDR (--master-addr) must name node 0's own interface",
                 host);
  }
  if (fd < 0) {
    TANDEM_THROW(CommError,
                 "c10d store: cannot listen on {}:{}: {}; pass another port (tandem launch: "
                 "--master-port), or 0 for a free one",
                 host, port, std::strerror(error));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  bound_port = addr.ss_family == AF_INET6
                   ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                   : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return fd;
}

}  // namespace

C10dStoreHost::C10dStoreHost(const std::string& host, int port, std::chrono::milliseconds timeout,
                             const std::string& port_in_use_advice)
    : impl_(std::make_unique<Impl>()) {
  const int fd = listen_on(host, port, port_, port_in_use_advice);
  try {
    impl_->store = compat::make_tcp_store_server(host, port_, fd, timeout);
  } catch (const std::exception& e) {
    ::close(fd);
    TANDEM_THROW(Error, "c10d store: cannot start on {}:{}: {}", host, port_, e.what());
  }
}

C10dStoreHost::~C10dStoreHost() = default;

}  // namespace tandem
