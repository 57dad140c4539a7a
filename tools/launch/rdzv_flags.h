#pragma once
// torchrun's rendezvous flags, parsed into LaunchOptions: --rdzv-endpoint
// (HOST, HOST:PORT, [IPv6]:PORT) and --rdzv-conf (KEY=VALUE,...).

#include <string>

#include "launch/launch_options.h"

namespace tandem::cli {

// Sets master_addr (and master_port when the endpoint has one) from
// `endpoint`, with the *_given flags. Throws UsageError on a missing host or
// a port that is not a number from 0 to 65535. Pure but for `opts`.
void apply_rdzv_endpoint(const std::string& endpoint, LaunchOptions& opts);

// Sets the rendezvous settings `conf` names (join_timeout,
// last_call_timeout, keep_alive_interval, keep_alive_max_attempt, is_host).
// Throws UsageError naming a key tandem does not read or a bad value.
void apply_rdzv_conf(const std::string& conf, LaunchOptions& opts);

}  // namespace tandem::cli
