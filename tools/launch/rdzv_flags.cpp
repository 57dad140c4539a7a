// torchrun's rendezvous flags: --rdzv-endpoint and --rdzv-conf.

#include "launch/rdzv_flags.h"

#include <cctype>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tandem/core/error.h"

namespace tandem::cli {

// torchrun's endpoint forms: HOST, HOST:PORT, [IPv6] and [IPv6]:PORT (the
// brackets are not part of the address); a port is 0-65535 in digits only.
void apply_rdzv_endpoint(const std::string& endpoint, LaunchOptions& opts) {
  auto bracketed = [](const std::string& text) {
    return text.size() > 1 && text.front() == '[' && text.back() == ']';
  };
  std::string host = endpoint;
  std::optional<std::string> port;
  if (!bracketed(host)) {
    const auto colon = host.rfind(':');
    if (colon != std::string::npos) {
      port = host.substr(colon + 1);
      host = host.substr(0, colon);
    }
  }
  if (bracketed(host)) host = host.substr(1, host.size() - 2);
  TANDEM_CHECK_ARG(!host.empty(), "--rdzv-endpoint '{}' has no host; write HOST:PORT", endpoint);
  opts.master_addr_given = true;
  opts.rdzv_endpoint_given = true;
  opts.master_addr = host;
  if (!port) return;
  const bool digits = !port->empty() && port->size() <= 5 &&
                      port->find_first_not_of("0123456789") == std::string::npos;
  TANDEM_CHECK_ARG(digits && std::stoi(*port) <= 65535,
                   "--rdzv-endpoint '{}': the port '{}' is not a number from 0 to 65535; write "
                   "HOST:PORT",
                   endpoint, *port);
  opts.master_port_given = true;
  opts.master_port = std::stoi(*port);
}

// torchrun's --rdzv-conf "join_timeout=60,last_call_timeout=5".
void apply_rdzv_conf(const std::string& conf, LaunchOptions& opts) {
  std::stringstream items(conf);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string name = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (name == "is_host") {
      // torch's RendezvousParameters.get_as_bool.
      std::string lower = value;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const bool yes = lower == "1" || lower == "true" || lower == "t" || lower == "yes" ||
                       lower == "y";
      const bool no = lower == "0" || lower == "false" || lower == "f" || lower == "no" ||
                      lower == "n";
      TANDEM_CHECK_ARG(yes || no,
                       "--rdzv-conf is_host: '{}' is not a boolean; write is_host=true on the "
                       "node that hosts the store, is_host=false on the others",
                       value);
      opts.rdzv_is_host = yes;
      continue;
    }
    double seconds = 0;
    try {
      size_t used = 0;
      seconds = std::stod(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      TANDEM_CHECK_ARG(name != "join_timeout" && name != "last_call_timeout" &&
                           name != "keep_alive_interval" && name != "keep_alive_max_attempt",
                       "--rdzv-conf {}: '{}' is not a number", name, value);
    }
    if (name == "join_timeout") {
      opts.rdzv_timeout_s = seconds;
    } else if (name == "last_call_timeout") {
      opts.rdzv_last_call_s = seconds;
    } else if (name == "keep_alive_interval") {
      opts.rdzv_keep_alive_interval_s = seconds;
    } else if (name == "keep_alive_max_attempt") {
      TANDEM_CHECK_ARG(seconds >= 1 && seconds == static_cast<int>(seconds),
                       "--rdzv-conf keep_alive_max_attempt: '{}' is not a whole number >= 1",
                       value);
      opts.rdzv_keep_alive_attempts = static_cast<int>(seconds);
    } else {
      TANDEM_THROW(UsageError,
                   "--rdzv-conf {}: not supported. tandem's rendezvous reads join_timeout, "
                   "last_call_timeout, keep_alive_interval, keep_alive_max_attempt and "
                   "is_host; its store has no separate read or close timeouts",
                   name);
    }
  }
}

}  // namespace tandem::cli
