#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "tandem/comm/store_server.h"
#include "comm/token_store.h"
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

namespace {

// A store off loopback needs the job's token, on every rank: each one
// refuses at once, rather than rank 0 refusing and the others waiting for a
// store that never comes.
void check_token(const RankEnv& env) {
  if (env.store_token.empty() && !is_loopback_host(env.master_addr)) {
    TANDEM_THROW(UsageError,
                 "the rendezvous store would be on MASTER_ADDR={}, which is not a "
                 "loopback address, without a token: anyone on the network could join or "
                 "disturb the job. Make one token and export the same value on every node: "
                 "`export TANDEM_STORE_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' "
                 "\\n')`{}",
                 env.master_addr,
                 env.source == RankEnvSource::kSlurm
                     ? " before srun (srun passes the environment to every task), or set "
                       "TANDEM_STORE_TOKEN_FILE to a path on a file system every node shares "
                       "(the first task writes a token there; docs/slurm.md)"
                     : "");
  }
}

// Rank 0 of a job without a launcher hosts the store on MASTER_ADDR's own
// address, and connects to it like every other rank.
c10::intrusive_ptr<TokenStore> host_store(const RankEnv& env, std::chrono::milliseconds timeout) {
  StoreServerOptions options;
  options.host = env.master_addr;
  options.port = env.master_port;
  options.token = env.store_token;
  options.run_scope = env.slurm_step;
  auto server = std::make_shared<StoreServer>(options);
  auto store = c10::make_intrusive<TokenStore>(server->address(), server->port(),
                                               env.store_token, timeout, env.slurm_step);
  store->keep_alive(std::move(server));
  return store;
}

}  // namespace

compat::StorePtr connect_store(const RankEnv& env, std::chrono::milliseconds timeout) {
  compat::StorePtr store;
  if (!env.agent_store) check_token(env);
  if (env.agent_store && env.store_token.empty()) {
    // A foreign launcher's store (torchrun): a c10d TCPStore, no token.
    try {
      store = compat::make_tcp_store_client(env.master_addr, env.master_port, env.world_size,
                                            timeout);
    } catch (const std::exception& e) {
      std::string reason = e.what();
      reason.resize(std::min(reason.find('\n'), reason.size()));
      TANDEM_THROW(TimeoutError,
                   "could not reach the launcher's rendezvous store at {}:{} within {} ms: {}. "
                   "Check that MASTER_ADDR/MASTER_PORT are the same on every rank",
                   env.master_addr, env.master_port, timeout.count(), reason);
    }
  } else if (env.rank == 0 && !env.agent_store) {
    store = host_store(env, timeout);
  } else {
    store = c10::make_intrusive<TokenStore>(env.master_addr, env.master_port, env.store_token,
                                            timeout, env.slurm_step);
  }
  // Each restart of the job gets fresh keys in the launcher's long-lived store.
  return c10::make_intrusive<c10d::PrefixStore>(
      "tandem/" + std::to_string(env.restart_count), store);
}

}  // namespace tandem::detail
