#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "tandem/core/error.h"

namespace tandem::detail {

std::string local_address_toward(const std::string& remote_host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  std::string port_text = std::to_string(port > 0 ? port : 9);
  if (getaddrinfo(remote_host.c_str(), port_text.c_str(), &hints, &result) != 0) return "";
  std::string address;
  for (addrinfo* ai = result; ai != nullptr && address.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* src = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, src, text, sizeof(text)) != nullptr) address = text;
    }
    ::close(fd);
  }
  freeaddrinfo(result);
  return address;
}

compat::StorePtr connect_store(const RankEnv& env, std::chrono::milliseconds timeout) {
  const bool host_it = env.rank == 0 && !env.agent_store;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = compat::make_tcp_store(env.master_addr, env.master_port, host_it, env.world_size,
                                   timeout);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    auto newline = reason.find('\n');
    if (newline != std::string::npos) reason.resize(newline);
    if (host_it) {
      TANDEM_THROW(CommError,
                   "cannot host the rendezvous store on port {}: {}. Another job may be using "
                   "the port: pick a free one with --master-port (MASTER_PORT), or let "
                   "`tandem launch --standalone` choose one",
                   env.master_port, reason);
    }
    TANDEM_THROW(TimeoutError,
                 "could not reach the rendezvous store at {}:{} within {} ms: {}. Check that "
                 "rank 0 is running and that MASTER_ADDR/MASTER_PORT are the same on every rank",
                 env.master_addr, env.master_port, timeout.count(), reason);
  }
  // Each restart of the job gets fresh keys in the launcher's long-lived store.
  return c10::make_intrusive<c10d::PrefixStore>(
      "tandem/" + std::to_string(env.restart_count), store);
}

}  // namespace tandem::detail
