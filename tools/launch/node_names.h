#pragma once
// The names and addresses this machine answers to, and whether a host name
// or address names it: how a node finds itself in --include, and which
// node hosts the store of `--rdzv-backend c10d --rdzv-endpoint HOST:PORT`.

#include <string>
#include <vector>

struct sockaddr;

namespace tandem::cli {

// The numeric text of an IPv4 or IPv6 socket address ("10.0.0.2",
// "fd00::1"); "" for another family. Pure.
std::string address_text(const sockaddr* address);

// Every name this node answers to: TANDEM_HOST_NAME (a --hostfile head's
// name for it), its host name (and the part before the first dot),
// localhost, 127.0.0.1, then the IPv4 and IPv6 addresses of its interfaces.
std::vector<std::string> node_names();

// Every address `host` resolves to, as numeric text (address_text()), in
// getaddrinfo's order; empty when it does not resolve. Thread-safe.
std::vector<std::string> resolved_addresses(const std::string& host);

// Whether `host` (a name, or a numeric IPv4 or IPv6 address without
// brackets) is one of `names`, itself or by any address it resolves to.
// Resolves `host`; thread-safe.
bool names_one_of(const std::string& host, const std::vector<std::string>& names);

// names_one_of(host, node_names()): whether `host` is this machine.
inline bool names_this_node(const std::string& host) { return names_one_of(host, node_names()); }

}  // namespace tandem::cli
