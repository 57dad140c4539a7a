#pragma once
// Rendezvous: the store every rank meets at, and the address Gloo uses.

#include <chrono>
#include <string>

#include "core/torch_compat.h"
#include "tandem/core/rank_env.h"

namespace tandem::detail {

// Connects to the rendezvous store at env.master_addr:env.master_port:
// tandem's own store (token_store.h) with env.store_token, hosting it first
// on rank 0 when no launcher does; or, under a foreign launcher with an
// agent store and no token (torchrun), that launcher's c10d TCPStore.
// Throws CommError/TimeoutError with the address and the fix, UsageError
// when rank 0 would host a store off loopback without a token.
compat::StorePtr connect_store(const RankEnv& env, std::chrono::milliseconds timeout);

// The local IPv4/IPv6 address the kernel would use to reach `remote_host`,
// found by connecting a UDP socket (no packet is sent). Empty on failure.
std::string local_address_toward(const std::string& remote_host, int port);

}  // namespace tandem::detail
