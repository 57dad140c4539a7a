// Which host names and addresses name this node (node_names.h): how a node
// finds itself in --include, and the node an --rdzv-endpoint names.

#include <arpa/inet.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "launch/node_names.h"

namespace tandem::cli {
namespace {

bool lists_name(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(NodeNames, AnIPv6AddressIsWrittenCanonically) {
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  ASSERT_EQ(::inet_pton(AF_INET6, "fd00:0:0::1", &six.sin6_addr), 1);
  EXPECT_EQ(address_text(reinterpret_cast<const sockaddr*>(&six)), "fd00::1");
  sockaddr_in four{};
  four.sin_family = AF_INET;
  ASSERT_EQ(::inet_pton(AF_INET, "10.0.0.2", &four.sin_addr), 1);
  EXPECT_EQ(address_text(reinterpret_cast<const sockaddr*>(&four)), "10.0.0.2");
}

TEST(NodeNames, AHostMatchesByNameOrByAnyAddressItResolvesTo) {
  const std::vector<std::string> names = {"node1", "localhost", "10.0.0.1", "fd00::1"};
  EXPECT_TRUE(names_one_of("node1", names));
  EXPECT_TRUE(names_one_of("10.0.0.1", names));
  // `--rdzv-endpoint [fd00::1]:29400`, however the address is written.
  EXPECT_TRUE(names_one_of("fd00::1", names));
  EXPECT_TRUE(names_one_of("fd00:0:0:0::1", names));
  EXPECT_FALSE(names_one_of("fd00::2", names));
  EXPECT_FALSE(names_one_of("10.0.0.2", names));
}

TEST(NodeNames, ThisNodesIPv6AddressesNameIt) {
  // ::1 is on lo wherever the kernel has IPv6 (/proc/net/if_inet6 lists it).
  std::ifstream inet6("/proc/net/if_inet6");
  std::string line;
  bool loopback6 = false;
  while (std::getline(inet6, line)) {
    loopback6 = loopback6 || line.rfind("00000000000000000000000000000001", 0) == 0;
  }
  if (!loopback6) GTEST_SKIP() << "skipped: this machine has no IPv6 loopback address";
  EXPECT_TRUE(lists_name(node_names(), "::1"));
  EXPECT_TRUE(names_this_node("::1"));
  EXPECT_TRUE(names_this_node("0:0:0:0:0:0:0:1"));
}

}  // namespace
}  // namespace tandem::cli
