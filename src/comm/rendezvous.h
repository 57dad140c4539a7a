#pragma once
// Rendezvous: the TCPStore every rank meets at, and the address Gloo uses.

#include <chrono>
#include <string>

#include "core/torch_compat.h"
#include "tandem/core/rank_env.h"

namespace tandem::detail {

// Connects to (or, on rank 0 without a launcher-hosted store, hosts) the
// TCPStore at env.master_addr:env.master_port. Throws CommError/TimeoutError
// with the address and the fix.
compat::StorePtr connect_store(const RankEnv& env, std::chrono::milliseconds timeout);

// The local IPv4/IPv6 address the kernel would use to reach `remote_host`,
// found by connecting a UDP socket (no packet is sent). Empty on failure.
std::string local_address_toward(const std::string& remote_host, int port);

}  // namespace tandem::detail
