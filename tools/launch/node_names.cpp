// The names and addresses this machine answers to (node_names.h).

#include "launch/node_names.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace tandem::cli {

std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {0};
  const void* raw = nullptr;
  if (address->sa_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in*>(address)->sin_addr;
  } else if (address->sa_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
  } else {
    return "";
  }
  return ::inet_ntop(address->sa_family, raw, text, sizeof text) != nullptr ? text : "";
}

std::vector<std::string> node_names() {
  std::vector<std::string> names;
  // The name a --hostfile job's head gave this host (host_fanout.h).
  if (const char* given = std::getenv("TANDEM_HOST_NAME"); given != nullptr && *given) {
    names.emplace_back(given);
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) {
    names.emplace_back(host);
    std::string short_name(host);
    auto dot = short_name.find('.');
    if (dot != std::string::npos) names.push_back(short_name.substr(0, dot));
  }
  names.emplace_back("localhost");
  names.emplace_back("127.0.0.1");
  // Its addresses too: hostfiles, filters and endpoints often name hosts by
  // address, IPv6 ones included (`--rdzv-endpoint [fd00::1]:29400`).
  ifaddrs* addresses = nullptr;
  if (::getifaddrs(&addresses) == 0) {
    for (ifaddrs* a = addresses; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr) continue;
      const std::string text = address_text(a->ifa_addr);
      if (!text.empty() && std::find(names.begin(), names.end(), text) == names.end()) {
        names.push_back(text);
      }
    }
    ::freeifaddrs(addresses);
  }
  return names;
}

std::vector<std::string> resolved_addresses(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return {};
  std::vector<std::string> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) out.push_back(address_text(a->ai_addr));
  ::freeaddrinfo(found);
  return out;
}

bool names_one_of(const std::string& host, const std::vector<std::string>& names) {
  if (std::find(names.begin(), names.end(), host) != names.end()) return true;
  // "fd00:0::1" and "fd00::1" are one address: compare the canonical texts.
  for (const std::string& address : resolved_addresses(host)) {
    if (std::find(names.begin(), names.end(), address) != names.end()) return true;
  }
  return false;
}

}  // namespace tandem::cli
