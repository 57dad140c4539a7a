#include <gtest/gtest.h>

#include "launch/host_filter.h"
#include "launch/launch_options.h"
#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

const std::vector<std::string> kNames = {"worker7", "localhost"};

TEST(HostFilter, ParsesDeepSpeedSyntax) {
  HostSlots hosts = parse_host_filter("worker7:0,2@worker8@worker9:1", "--include");
  EXPECT_EQ(hosts["worker7"], (std::set<int>{0, 2}));
  EXPECT_TRUE(hosts["worker8"].empty());
  EXPECT_EQ(hosts["worker9"], (std::set<int>{1}));
}

TEST(HostFilter, RejectsMalformedFilters) {
  EXPECT_THROW(parse_host_filter("host:a", "--include"), UsageError);
  EXPECT_THROW(parse_host_filter("host:0@@x", "--include"), UsageError);
  EXPECT_THROW(parse_host_filter(":1", "--include"), UsageError);
  EXPECT_THROW(parse_host_filter("h:0@h:1", "--include"), UsageError);
}

TEST(HostFilter, IncludeSelectsThisNodesSlots) {
  EXPECT_EQ(select_local_slots(4, "worker7:1,3@other:0", "", kNames), (std::vector<int>{1, 3}));
  EXPECT_EQ(select_local_slots(4, "localhost", "", kNames), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_THROW(select_local_slots(4, "other:0", "", kNames), UsageError);
  EXPECT_THROW(select_local_slots(2, "worker7:5", "", kNames), UsageError);
}

TEST(HostFilter, ExcludeRemovesSlots) {
  EXPECT_EQ(select_local_slots(4, "", "worker7:0,2", kNames), (std::vector<int>{1, 3}));
  EXPECT_EQ(select_local_slots(2, "", "other:0", kNames), (std::vector<int>{0, 1}));
  EXPECT_THROW(select_local_slots(2, "", "worker7", kNames), UsageError);
  EXPECT_THROW(select_local_slots(2, "worker7:0", "worker7:1", kNames), UsageError);
}

LaunchOptions parse(std::vector<std::string> args, bool* help) {
  args.insert(args.begin(), "launch");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_launch_options(static_cast<int>(argv.size()), argv.data(), help);
}

TEST(LaunchOptions, AcceptsDashesUnderscoresAndEquals) {
  bool help = false;
  auto opts = parse({"--nproc_per_node=3", "--master-port", "1234", "--node_rank", "1", "--nnodes=2",
                     "prog", "--nproc-per-node", "9"},
                    &help);
  EXPECT_EQ(opts.nproc_per_node, 3);
  EXPECT_EQ(opts.master_port, 1234);
  EXPECT_EQ(opts.node_rank, 1);
  EXPECT_EQ(opts.program, (std::vector<std::string>{"prog", "--nproc-per-node", "9"}));
}

TEST(LaunchOptions, StandaloneAndRdzvEndpoint) {
  bool help = false;
  auto standalone = parse({"--standalone", "prog"}, &help);
  EXPECT_EQ(standalone.master_port, 0);
  EXPECT_EQ(standalone.master_addr, "127.0.0.1");
  auto rdzv = parse({"--rdzv_endpoint", "10.1.2.3:4567", "--", "prog"}, &help);
  EXPECT_EQ(rdzv.master_addr, "10.1.2.3");
  EXPECT_EQ(rdzv.master_port, 4567);
  EXPECT_THROW(parse({"--nnodes", "2", "--master-port", "0", "prog"}, &help), UsageError);
  EXPECT_THROW(parse({"--tee", "3", "prog"}, &help), UsageError);
}

}  // namespace
}  // namespace tandem::cli
