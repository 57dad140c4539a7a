#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launch/host_filter.h"
#include "launch/launch_options.h"
#include "support/scoped_env.h"
#include "support/usage_error.h"
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

// As --include is: DeepSpeed refuses "No slot '7' specified on host" and
// "Hostname ... not found"; before, both ran the job with every slot.
TEST(HostFilter, ExcludeOfASlotOrHostThatDoesNotExistIsRefused) {
  const std::string slot = testing::usage_error_message(
      [] { layout_nodes(2, 1, std::nullopt, "", "localhost:7", kNames); });
  EXPECT_NE(slot.find("--exclude slot 7 is outside this node's 2 slots (0-1)"), std::string::npos)
      << slot;
  const std::string host = testing::usage_error_message(
      [] { layout_nodes(2, 1, std::nullopt, "", "nohost", kNames); });
  EXPECT_NE(host.find("--exclude 'nohost': host 'nohost' is not this node (worker7), the only "
                      "node of this job"),
            std::string::npos)
      << host;
  // A c10d node of several: other hosts' entries are theirs to apply.
  EXPECT_EQ(select_local_slots(2, "", "other:5@worker7:1", kNames), (std::vector<int>{0}));
}

TEST(HostFilter, KeepsTheOrderTheFilterNamesHostsIn) {
  auto hosts = parse_host_filter_in_order("zeta:1@alpha@mid:0,2", "--include");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].first, "zeta");
  EXPECT_EQ(hosts[1].first, "alpha");
  EXPECT_TRUE(hosts[1].second.empty());
  EXPECT_EQ(hosts[2].second, (std::set<int>{0, 2}));
}

TEST(NodeLayout, IncludeAcrossNodesCountsTheSelectedSlotsOfEveryNode) {
  // DeepSpeed's example: two slots here, one on the other host, a world of 3.
  const std::string include = "localhost:0,1@otherhost:0";
  NodeLayout here = layout_nodes(2, 2, std::nullopt, include, "", {"node-a", "localhost"});
  EXPECT_EQ(here.world_size, 3);
  EXPECT_EQ(here.node_rank, 0);
  EXPECT_EQ(here.rank_offset, 0);
  EXPECT_EQ(here.slots, (std::vector<int>{0, 1}));
  NodeLayout there = layout_nodes(2, 2, std::nullopt, include, "", {"otherhost", "localhost"});
  EXPECT_EQ(there.world_size, 3) << "every node computes the same world size";
  EXPECT_EQ(there.node_rank, 1);
  EXPECT_EQ(there.rank_offset, 2) << "after the first node's two processes";
  EXPECT_EQ(there.slots, (std::vector<int>{0}));
}

TEST(NodeLayout, AHostNamedWithoutSlotsBringsTheWholePool) {
  const std::string include = "10.0.0.1:3@10.0.0.2@10.0.0.3:0,2";
  NodeLayout last = layout_nodes(4, 3, std::nullopt, include, "", {"c", "10.0.0.3"});
  EXPECT_EQ(last.world_size, 1 + 4 + 2);
  EXPECT_EQ(last.node_rank, 2);
  EXPECT_EQ(last.rank_offset, 5);
  EXPECT_EQ(last.slots, (std::vector<int>{0, 2}));
  NodeLayout middle = layout_nodes(4, 3, 1, include, "", {"b", "10.0.0.2"});
  EXPECT_EQ(middle.slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(middle.rank_offset, 1);
}

TEST(NodeLayout, WithoutAFilterEveryNodeRunsTheSameSlots) {
  NodeLayout layout = layout_nodes(3, 4, 2, "", "", kNames);
  EXPECT_EQ(layout.world_size, 12);
  EXPECT_EQ(layout.node_rank, 2);
  EXPECT_EQ(layout.rank_offset, 6);
  NodeLayout one = layout_nodes(4, 1, std::nullopt, "", "worker7:0", kNames);
  EXPECT_EQ(one.world_size, 3) << "--exclude on one node drops its slots";
  EXPECT_EQ(one.slots, (std::vector<int>{1, 2, 3}));
}

TEST(NodeLayout, FiltersThatWouldSplitTheJobAreRefusedWithTheFix) {
  const std::string wrong_count = testing::usage_error_message(
      [] { layout_nodes(2, 3, std::nullopt, "worker7:0@other:0", "", kNames); });
  EXPECT_NE(wrong_count.find("names 2 host(s) but --nnodes is 3"), std::string::npos)
      << wrong_count;
  const std::string disagreeing = testing::usage_error_message(
      [] { layout_nodes(2, 2, 0, "other:0@worker7:0", "", kNames); });
  EXPECT_NE(disagreeing.find("--node-rank 0 disagrees"), std::string::npos) << disagreeing;
  EXPECT_NE(disagreeing.find("node 0 is 'other'"), std::string::npos) << disagreeing;
  const std::string exclude = testing::usage_error_message(
      [] { layout_nodes(2, 2, 0, "", "worker7:0", kNames); });
  EXPECT_NE(exclude.find("would disagree on the world size"), std::string::npos) << exclude;
  EXPECT_NE(exclude.find("--include"), std::string::npos) << exclude;
  const std::string absent = testing::usage_error_message(
      [] { layout_nodes(2, 2, std::nullopt, "a:0@b:0", "", kNames); });
  EXPECT_NE(absent.find("does not name this node"), std::string::npos) << absent;
  const std::string outside = testing::usage_error_message(
      [] { layout_nodes(2, 2, std::nullopt, "worker7:5@b:0", "", kNames); });
  EXPECT_NE(outside.find("slot 5 is outside"), std::string::npos) << outside;
}

LaunchOptions parse(std::vector<std::string> args, bool* help) {
  args.insert(args.begin(), "launch");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_launch_options(static_cast<int>(argv.size()), argv.data(), help);
}

// What parsing `args` refuses them with, or "accepted".
std::string refusal(std::vector<std::string> args) {
  bool help = false;
  try {
    parse(std::move(args), &help);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

// A range refusal states the range and echoes the value given.
TEST(LaunchFlags, RangeErrorsStateTheTrueRangeAndTheValue) {
  EXPECT_NE(refusal({"--monitor-interval", "0", "train"})
                .find("--monitor-interval must be more than 0 and at most 3600 seconds, got 0"),
            std::string::npos);
  EXPECT_NE(refusal({"--grace-period", "601", "train"})
                .find("--grace-period must be from 0 to 600 seconds, got 601"),
            std::string::npos);
  EXPECT_NE(refusal({"--max-restarts", "-1", "train"})
                .find("--max-restarts must be 0 or more, got -1"),
            std::string::npos);
  EXPECT_NE(refusal({"--tee", "4", "--log-dir", "d", "train"}).find("got --tee 4 --redirects 0"),
            std::string::npos);
  EXPECT_NE(refusal({"--hostfile", "h", "--master-port", "29500", "--ssh-port", "0", "train"})
                .find("--ssh-port must be from 1 to 65535, got 0"),
            std::string::npos);
}

// Any --ssh-port without --hostfile is refused, 0 as well as 22.
TEST(LaunchFlags, SshPortWithoutHostfileIsRefusedWhateverItsValue) {
  for (const char* port : {"0", "22"}) {
    EXPECT_NE(refusal({"--ssh-port", port, "train"})
                  .find("--launcher, --launcher-args and --ssh-port go with --hostfile"),
              std::string::npos)
        << port;
  }
}

// A PET_* variable (torchrun's environment for a flag) that does not
// parse is named, with the flag it stands for.
TEST(LaunchFlags, AnEnvironmentVariableThatDoesNotParseIsNamed) {
  testing::ScopedEnv env;
  env.set("PET_MAX_RESTARTS", "abc");
  const std::string message = refusal({"train"});
  EXPECT_NE(message.find("the environment variable PET_MAX_RESTARTS=abc is not a valid "
                         "--max-restarts"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Fix or unset PET_MAX_RESTARTS"), std::string::npos) << message;
  bool help = false;
  EXPECT_EQ(parse({"--max-restarts", "2", "train"}, &help).max_restarts, 2)
      << "the flag beats the variable";
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

// An address that cannot be one is refused where it is given, not found
// out as a rendezvous that never meets on the other nodes.
TEST(LaunchOptions, AMainProcessAddressThatCannotBeOneIsRefused) {
  for (const auto& [flags, reason] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--main_process_ip", "10.0.0.1:29500"}, "give the address alone ('10.0.0.1')"},
           {{"--master-addr", "300.1.1.1"}, "not an IPv4 address"},
           {{"--rdzv-endpoint", "bad host:29400"}, "' ' cannot be part of one"}}) {
    std::vector<std::string> args{"--nnodes", "2", "--node-rank", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back("prog");
    const std::string message = refusal(args);
    EXPECT_NE(message.find(reason), std::string::npos) << message;
  }
  bool help = false;
  for (const std::string host : {"10.0.0.1", "node-7.cluster", "fd00::1", "gpu_node3"}) {
    EXPECT_EQ(parse({"--nnodes", "2", "--node-rank", "1", "--master-addr", host, "prog"}, &help)
                  .master_addr,
              host);
  }
  EXPECT_EQ(parse({"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "[fd00::1]:29400",
                   "prog"},
                  &help)
                .master_addr,
            "fd00::1");
}

TEST(LaunchOptions, RendezvousFlagsAreUsedOrRefusedNeverIgnored) {
  bool help = false;
  auto c10d = parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-id", "run7",
                     "--rdzv-timeout", "30", "--rdzv-endpoint", "10.0.0.1:29400", "prog"},
                    &help);
  EXPECT_TRUE(rendezvous_at_store(c10d));
  EXPECT_EQ(c10d.rdzv_id, "run7");
  EXPECT_EQ(c10d.rdzv_timeout_s, 30);
  auto ranked = parse({"--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "prog"},
                      &help);
  EXPECT_FALSE(rendezvous_at_store(ranked)) << "a given --node-rank is used as it is";
  const std::string etcd = refusal({"--rdzv-backend", "etcd", "prog"});
  EXPECT_NE(etcd.find("--rdzv-backend etcd is not supported"), std::string::npos) << etcd;
  const std::string unranked = refusal({"--nnodes", "2", "prog"});
  EXPECT_NE(unranked.find("without --node-rank would make every node node 0"), std::string::npos)
      << unranked;
  EXPECT_NE(unranked.find("--rdzv-backend c10d"), std::string::npos) << unranked;
  EXPECT_NE(refusal({"--rdzv-timeout", "0", "prog"}).find("--rdzv-timeout must be > 0"),
            std::string::npos);
  const LaunchOptions plain = parse({"prog"}, &help);
  EXPECT_DOUBLE_EQ(monitor_interval(plain, 5.0), 5.0) << "a --hostfile head's default";
  EXPECT_DOUBLE_EQ(monitor_interval(plain, 0.5), 0.5) << "a c10d node's default";
  auto monitored = parse({"--monitor-interval", "2.5", "prog"}, &help);
  EXPECT_TRUE(monitored.monitor_interval_given) << "warned about where it has no effect";
  EXPECT_DOUBLE_EQ(monitor_interval(monitored, 5.0), 2.5) << "given, it wins in every mode";
  EXPECT_NE(refusal({"--monitor-interval", "0", "prog"})
                .find("--monitor-interval must be more than 0 and at most 3600 seconds"),
            std::string::npos);
}

TEST(LaunchOptions, AccelerateAndDeepSpeedSpellingsMapToTandemFlags) {
  bool help = false;
  // accelerate launch --multi_gpu --num_processes 8 --num_machines 2 --machine_rank 1
  //   --main_process_ip 10.0.0.1 --main_process_port 29501 --mixed_precision bf16 train
  auto accelerate = parse({"--multi_gpu", "--num_processes", "8", "--num_machines", "2",
                           "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
                           "--main_process_port=29501", "--mixed_precision", "bf16", "train"},
                          &help);
  EXPECT_EQ(accelerate.nproc_per_node, 4) << "accelerate counts processes over all machines";
  EXPECT_EQ(accelerate.nnodes, 2);
  EXPECT_EQ(accelerate.node_rank, 1);
  EXPECT_EQ(accelerate.master_addr, "10.0.0.1");
  EXPECT_EQ(accelerate.master_port, 29501);
  ASSERT_TRUE(accelerate.mixed_precision.has_value());
  EXPECT_EQ(*accelerate.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(accelerate.program, (std::vector<std::string>{"train"}));
  // deepspeed --num_gpus 2 --num_nodes 2 --master_addr 10.0.0.1 --master_port 29502 train
  auto deepspeed = parse({"--num_gpus", "2", "--num_nodes", "2", "--node_rank", "0",
                          "--master_addr", "10.0.0.1", "--master_port", "29502", "train"},
                         &help);
  EXPECT_EQ(deepspeed.nproc_per_node, 2) << "deepspeed's --num_gpus is per node";
  EXPECT_EQ(deepspeed.nnodes, 2);
  EXPECT_EQ(deepspeed.master_port, 29502);
  auto fixed = parse({"--nnodes", "2:2", "--node-rank", "1", "train"}, &help);
  EXPECT_EQ(fixed.nnodes, 2) << "torchrun's MIN:MAX with MIN == MAX";

  EXPECT_NE(refusal({"--nnodes", "1:2", "--node-rank", "0", "train"})
                .find("needs nodes that meet at the store: --rdzv-backend c10d"),
            std::string::npos);
  auto elastic = parse({"--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        "10.0.0.1:29400", "--rdzv-conf",
                        "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5",
                        "train"},
                       &help);
  EXPECT_EQ(elastic.nnodes, 3) << "MAX";
  EXPECT_EQ(elastic.min_nodes, 1);
  EXPECT_EQ(elastic.rdzv_last_call_s, 2);
  EXPECT_EQ(elastic.rdzv_keep_alive_interval_s, 1);
  EXPECT_EQ(elastic.rdzv_keep_alive_attempts, 5);
  EXPECT_FALSE(elastic.rdzv_is_host.has_value()) << "inferred from the endpoint";
  auto host = parse({"--rdzv-backend", "c10d", "--rdzv-conf", "is_host=True", "train"}, &help);
  EXPECT_EQ(host.rdzv_is_host, std::optional<bool>(true)) << "torch's get_as_bool, any case";
  auto guest = parse({"--rdzv-backend", "c10d", "--rdzv-conf", "is_host=0", "train"}, &help);
  EXPECT_EQ(guest.rdzv_is_host, std::optional<bool>(false));
  EXPECT_NE(refusal({"--rdzv-backend", "c10d", "--rdzv-conf", "is_host=maybe", "train"})
                .find("--rdzv-conf is_host: 'maybe' is not a boolean"),
            std::string::npos);
  EXPECT_NE(refusal({"--rdzv-backend", "c10d", "--rdzv-conf", "read_timeout=5", "train"})
                .find("--rdzv-conf read_timeout: not supported"),
            std::string::npos);
  EXPECT_NE(refusal({"--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=soon", "train"})
                .find("'soon' is not a number"),
            std::string::npos);
  EXPECT_NE(refusal({"--num_processes", "3", "--num_machines", "2", "--machine_rank", "0",
                     "train"})
                .find("must split evenly"),
            std::string::npos);
  EXPECT_NE(refusal({"--num_processes", "4", "--nproc-per-node", "2", "train"})
                .find("keep one"),
            std::string::npos);
  // --rdzv-endpoint as torchrun parses it: IPv6 in brackets, a port in
  // digits only.
  auto ipv6 = parse({"--rdzv-endpoint", "[::1]:29602", "train"}, &help);
  EXPECT_EQ(ipv6.master_addr, "::1");
  EXPECT_EQ(ipv6.master_port, 29602);
  EXPECT_EQ(parse({"--rdzv-endpoint", "[fe80::1]", "train"}, &help).master_addr, "fe80::1");
  auto named = parse({"--rdzv-endpoint", "head", "train"}, &help);
  EXPECT_EQ(named.master_addr, "head");
  EXPECT_EQ(named.master_port, 29500) << "no port: the default";
  // torchrun's c10d backend listens on 29400 when the endpoint has no port.
  auto c10d = parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "head", "train"}, &help);
  EXPECT_EQ(c10d.master_port, 29400);
  auto c10d_port = parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "head", "--master-port",
                          "29611", "train"},
                         &help);
  EXPECT_EQ(c10d_port.master_port, 29611) << "a port given otherwise stays";
  for (const char* bad : {"localhost:2941x", "localhost:", "localhost:70000", "localhost:-1"}) {
    EXPECT_NE(refusal({"--rdzv-endpoint", bad, "train"}).find("is not a number from 0 to 65535"),
              std::string::npos)
        << bad;
  }
  // The deepspeed launcher's --hostfile (test_hostfile.cpp, tests/multinode).
  EXPECT_EQ(parse({"--hostfile", "hosts", "train"}, &help).hostfile, "hosts");
}

}  // namespace
}  // namespace tandem::cli
