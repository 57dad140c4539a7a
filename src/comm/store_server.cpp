#include "tandem/comm/store_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <vector>

#include "comm/store_engine.h"
#include "core/text.h"
#include "tandem/core/error.h"
#include "tandem/core/logging.h"

namespace tandem {
namespace {

using detail::StoreEngine;
using Clock = StoreEngine::Clock;

constexpr std::uint64_t kListenTag = ~std::uint64_t{0};
constexpr std::uint64_t kWakeTag = kListenTag - 1;
// More than any job needs (one connection per rank plus the launcher's);
// past it, new connections are closed at once instead of exhausting fds.
constexpr std::size_t kMaxConnections = 16384;
constexpr std::size_t kReadChunk = 64 * 1024;
constexpr int kReadsPerEvent = 16;  // then let other connections have a turn

std::string numeric_address(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  const void* src = addr->sa_family == AF_INET
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(addr)->sin_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return inet_ntop(addr->sa_family, src, text, sizeof(text)) ? text : "?";
}

bool is_loopback(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr->sa_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a6) ||
           (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  }
  return false;
}

void set_events(int epoll_fd, int fd, std::uint64_t tag, std::uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
}

}  // namespace

bool is_wildcard_host(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

bool is_loopback_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) != 0) return false;
  bool all = result != nullptr;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) all = all && is_loopback(ai->ai_addr);
  ::freeaddrinfo(result);
  return all;
}

std::string random_store_token() { return detail::random_token_hex(); }

StoreServer::StoreServer(const StoreServerOptions& options)
    : token_(options.token),
      run_scope_(options.run_scope),
      handshake_timeout_(options.handshake_timeout) {
  TANDEM_CHECK_ARG(!is_wildcard_host(options.host),
                   "the rendezvous store listens on one address, not '{}' (every interface): "
                   "give node 0's own address, or 127.0.0.1 for a single node",
                   options.host);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const std::string port_text = std::to_string(options.port);
  int rc = ::getaddrinfo(options.host.c_str(), port_text.c_str(), &hints, &result);
  if (rc != 0) {
    TANDEM_THROW(CommError, "cannot host the rendezvous store: '{}' does not resolve ({}); give "
                 "node 0's address as MASTER_ADDR (--master-addr)", options.host, gai_strerror(rc));
  }
  int first_errno = 0;
  for (addrinfo* ai = result; ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    // Lets a new job reuse the port while old connections sit in TIME_WAIT;
    // it does not allow two listeners on one port.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
    } else {
      if (first_errno == 0) first_errno = errno;
      ::close(fd);
    }
  }
  ::freeaddrinfo(result);
  if (listen_fd_ < 0) {
    if (first_errno == EADDRINUSE) {
      TANDEM_THROW(PortInUseError,
                   "cannot host the rendezvous store on {} port {}: the port is already in use, "
                   "probably by another job; {}",
                   options.host, options.port,
                   options.port_in_use_advice.empty()
                       ? "pick another MASTER_PORT, the same for every rank"
                       : options.port_in_use_advice);
    }
    if (first_errno == EADDRNOTAVAIL) {
      TANDEM_THROW(CommError,
                   "cannot host the rendezvous store on {}: it is not an address of this "
                   "machine. MASTER_ADDR (--master-addr) must name node 0's own interface",
                   options.host);
    }
    TANDEM_THROW(CommError, "cannot host the rendezvous store on {} port {}: {}", options.host,
                 options.port, std::strerror(first_errno));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  address_ = numeric_address(reinterpret_cast<sockaddr*>(&bound));
  port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    ::close(listen_fd_);
    TANDEM_THROW(CommError, "eventfd() failed: {}", std::strerror(errno));
  }
  thread_ = std::thread([this] { run(); });
}

StoreServer::~StoreServer() {
  std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
  ::close(listen_fd_);
}

void StoreServer::run() {
  // Signals are the host program's business (the launcher's handlers wait
  // for them on its main thread): never take one here.
  sigset_t all;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
  StoreEngine engine(token_, handshake_timeout_, run_scope_);
  std::unordered_map<StoreEngine::ConnId, int> fds;
  std::unordered_map<StoreEngine::ConnId, bool> writing;  // EPOLLOUT armed
  std::vector<char> chunk(kReadChunk);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    log_warn("rendezvous store: epoll_create1 failed ({}); the store is not serving",
             std::strerror(errno));
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kWakeTag;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, wake_fd_, &ev);
  std::optional<Clock::time_point> listener_paused_until;

  auto drop = [&](StoreEngine::ConnId id) {
    auto it = fds.find(id);
    if (it == fds.end()) return;
    ::epoll_ctl(ep, EPOLL_CTL_DEL, it->second, nullptr);
    ::close(it->second);
    fds.erase(it);
    writing.erase(id);
    engine.close(id);
  };
  // Sends what the engine queued. A connection being refused gets one
  // attempt (its message is small), then is closed either way.
  auto flush = [&](StoreEngine::ConnId id) {
    auto it = fds.find(id);
    std::string* out = engine.outbox(id);
    if (it == fds.end() || out == nullptr) return;
    while (!out->empty()) {
      ssize_t n = ::send(it->second, out->data(), out->size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) return drop(id);
      out->erase(0, static_cast<std::size_t>(n));
    }
    if (engine.closing(id)) return drop(id);
    const bool want = !out->empty();
    if (want != writing[id]) {
      writing[id] = want;
      set_events(ep, it->second, id, EPOLLIN | (want ? EPOLLOUT : 0u));
    }
  };
  auto accept_all = [&](Clock::time_point now) {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: stop accepting for a moment rather than spin.
          set_events(ep, listen_fd_, kListenTag, 0);
          listener_paused_until = now + std::chrono::milliseconds(100);
        }
        return;
      }
      if (fds.size() >= kMaxConnections) {
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const StoreEngine::ConnId id = engine.open(now);
      epoll_event cev{};
      cev.events = EPOLLIN;
      cev.data.u64 = id;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) != 0) {
        ::close(fd);
        engine.close(id);
        continue;
      }
      fds[id] = fd;
      writing[id] = false;
    }
  };
  bool foreign_told = false;
  auto read_from = [&](StoreEngine::ConnId id, Clock::time_point now) {
    for (int i = 0; i < kReadsPerEvent; ++i) {
      auto it = fds.find(id);
      if (it == fds.end() || engine.closing(id)) return;
      ssize_t n = ::recv(it->second, chunk.data(), chunk.size(), MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) return drop(id);  // EOF or reset
      engine.receive(id, std::string_view(chunk.data(), static_cast<std::size_t>(n)), now);
      if (engine.foreign_clients() == 1 && !foreign_told) {
        // Most likely torch.distributed, whose TCPStore speaks c10d's
        // protocol: it would retry until its own timeout and say only that
        // a ping failed.
        foreign_told = true;
        log_warn("rendezvous store on port {}: a client that does not speak tandem's store "
                 "protocol was refused (torch.distributed's TCPStore?). A Python program "
                 "needs a c10d store, which tandem launch hosts when PROGRAM is a Python "
                 "interpreter or script; when a wrapper starts Python (a shell script, uv run, "
                 "conda run), add --c10d-store",
                 port_);
      }
    }
  };

  epoll_event events[64];
  for (;;) {
    int wait_ms = -1;
    const Clock::time_point before = Clock::now();
    auto next = engine.next_deadline();
    if (listener_paused_until && (!next || *listener_paused_until < *next)) next = listener_paused_until;
    if (next) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - before).count();
      wait_ms = static_cast<int>(std::clamp<long long>(left + 1, 0, 60 * 1000));
    }
    const int n = ::epoll_wait(ep, events, 64, wait_ms);
    if (n < 0 && errno != EINTR) break;
    const Clock::time_point now = Clock::now();
    bool stop = false;
    for (int i = 0; i < n; ++i) {
      const std::uint64_t tag = events[i].data.u64;
      try {
        if (tag == kWakeTag) {
          stop = true;
        } else if (tag == kListenTag) {
          accept_all(now);
        } else {
          if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_from(tag, now);
          if (events[i].events & EPOLLOUT) flush(tag);
        }
      } catch (const std::exception& e) {
        // Out of memory for one client's request: drop that client only.
        log_warn("rendezvous store: dropping a connection: {}", e.what());
        if (tag != kWakeTag && tag != kListenTag) drop(tag);
      }
    }
    if (stop) break;
    if (listener_paused_until && now >= *listener_paused_until) {
      listener_paused_until.reset();
      set_events(ep, listen_fd_, kListenTag, EPOLLIN);
    }
    engine.tick(now);
    for (StoreEngine::ConnId id : engine.take_ready()) flush(id);
  }
  for (const auto& [id, fd] : fds) ::close(fd);
  ::close(ep);
}

}  // namespace tandem
