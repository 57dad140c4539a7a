#pragma once
// Opening a TCP connection with a deadline, for libtandem's clients: the
// rendezvous store's (TokenStore) and the HTTP client's (MlflowWriter).
// Private to libtandem.

#include <chrono>
#include <string>

namespace tandem::detail {

// poll()'s timeout for `deadline`: the milliseconds left (0 once it has
// passed), or -1 (no limit) for time_point::max().
int poll_timeout_ms(std::chrono::steady_clock::time_point deadline);

// One attempt to connect to host:port: each address the name resolves to in
// turn, until one connects or `deadline` passes. Returns the socket,
// connected, non-blocking and close-on-exec; or -1, with why in `error`
// ("cannot resolve ...", "Connection refused", "Connection timed out").
int connect_tcp(const std::string& host, int port,
                std::chrono::steady_clock::time_point deadline, std::string& error);

}  // namespace tandem::detail
