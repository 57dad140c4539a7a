// DeepSpeed's hostfile and the slots a --hostfile job runs (hostfile.h),
// and the flags that go with --hostfile.

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launch/hostfile.h"
#include "launch/launch_options.h"
#include "tandem/core/error.h"
#include "support/usage_error.h"

using tandem::testing::usage_error_message;

namespace tandem::cli {
namespace {

const char* const kFile = "# the lab\nnode-a slots=2\n\n  node-b slots=4  # big one\nnode-c slots=1\n";

std::string describe(const std::vector<SelectedHost>& hosts) {
  return include_filter(hosts);
}

TEST(Hostfile, ReadsDeepSpeedsFormatInFileOrder) {
  const auto hosts = parse_hostfile(kFile, "hosts");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].name, "node-a");
  EXPECT_EQ(hosts[1].slots, 4);
  EXPECT_EQ(hosts[2].name, "node-c");
}

TEST(Hostfile, AMalformedLineIsNamedByFileAndLine) {
  EXPECT_NE(usage_error_message([] { parse_hostfile("a slots=2\nb slots=two\n", "hosts"); })
                .find("hostfile hosts line 2: 'b slots=two' is not 'HOST slots=N'"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse_hostfile("a slots=0\n", "h"); }).find("line 1"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse_hostfile("a slots=1 extra\n", "h"); }).find("line 1"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse_hostfile("a slots=1\na slots=2\n", "h"); })
                .find("host 'a' is listed twice"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse_hostfile("# nothing\n\n", "h"); }).find("lists no host"),
            std::string::npos);
}

TEST(Hostfile, SelectsEverySlotOrWhatTheFiltersLeave) {
  const auto hosts = parse_hostfile(kFile, "hosts");
  EXPECT_EQ(describe(select_hostfile_slots(hosts, "", "", {}, {}, "hosts")),
            "node-a:0,1@node-b:0,1,2,3@node-c:0");
  // --include: its slots, in the hostfile's host order (DeepSpeed's
  // parse_resource_filter keeps host_info's order); a host without slots
  // brings them all.
  EXPECT_EQ(describe(select_hostfile_slots(hosts, "node-b:3,1@node-a", "", {}, {}, "hosts")),
            "node-a:0,1@node-b:1,3");
  // --exclude: slots, or a whole host.
  EXPECT_EQ(describe(select_hostfile_slots(hosts, "", "node-b:0,2@node-c", {}, {}, "hosts")),
            "node-a:0,1@node-b:1,3");
  // --num-nodes / --num-gpus: the first hosts, the first slots.
  EXPECT_EQ(describe(select_hostfile_slots(hosts, "", "", 2, 1, "hosts")), "node-a:0@node-b:0");
  const auto sizes = select_hostfile_slots(hosts, "node-a:1@node-b:0", "", {}, {}, "hosts");
  EXPECT_EQ(sizes[0].pool, 2);
  EXPECT_EQ(sizes[1].pool, 4);
}

TEST(Hostfile, FiltersThatDoNotFitTheFileAreRefused) {
  const auto hosts = parse_hostfile(kFile, "hosts");
  auto select = [&](const std::string& inc, const std::string& exc, std::optional<int> nodes,
                    std::optional<int> gpus) {
    return usage_error_message([&] { select_hostfile_slots(hosts, inc, exc, nodes, gpus, "hosts"); });
  };
  EXPECT_NE(select("node-z:0", "", {}, {}).find("host 'node-z' is not in the hostfile hosts"),
            std::string::npos);
  EXPECT_NE(select("node-c:1", "", {}, {}).find("has slots 0..0"), std::string::npos);
  EXPECT_NE(select("node-a", "", 2, {}).find("give one or the other"), std::string::npos);
  EXPECT_NE(select("", "", 4, {}).find("--num-nodes 4"), std::string::npos);
  EXPECT_NE(select("", "", {}, 2).find("host 'node-c' has 1 slot(s)"), std::string::npos);
  EXPECT_NE(select("", "node-a@node-b@node-c", {}, {}).find("no slot to run on"),
            std::string::npos);
}

LaunchOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "launch");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return parse_launch_options(static_cast<int>(argv.size()), argv.data(), &help);
}

TEST(Hostfile, FlagsThatDoNotGoWithItAreRefused) {
  EXPECT_NE(usage_error_message([] { parse({"--hostfile", "h", "--launcher", "pdsh", "prog"}); })
                .find("tandem starts one ssh per host itself"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse({"--hostfile", "h", "--launcher", "openmpi", "prog"}); })
                .find("OMPI_*"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse({"--hostfile", "h", "--node-rank", "1", "--nnodes", "2", "p"}); })
                .find("numbers the hosts itself"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse({"--launcher-args", "-i key", "prog"}); })
                .find("go with --hostfile"),
            std::string::npos);
  EXPECT_NE(usage_error_message([] { parse({"--keep-global-batch", "prog"}); })
                .find("--keep-global-batch goes with jobs whose world size can change"),
            std::string::npos);
  const LaunchOptions ok = parse({"--hostfile", "h", "--ssh-port", "2222", "--launcher_args",
                                  "-i key", "--num_gpus", "2", "prog", "arg"});
  EXPECT_EQ(ok.hostfile, "h");
  EXPECT_EQ(ok.ssh_port, 2222);
  EXPECT_EQ(ok.launcher_args, "-i key");
  EXPECT_TRUE(ok.nproc_given);
  EXPECT_EQ(ok.program, (std::vector<std::string>{"prog", "arg"}));
}

// Accelerate's multi-node DeepSpeed keys stand for --hostfile and its filters.
TEST(Hostfile, AccelerateDeepSpeedHostfileKeysActAsTheFlags) {
  const Config config = parse_config_text(
      "distributed_type: DEEPSPEED\nnum_machines: 2\nmachine_rank: 1\n"
      "main_process_port: 29555\n"
      "deepspeed_config:\n  zero_stage: 2\n  deepspeed_hostfile: /etc/lab_hosts\n"
      "  deepspeed_inclusion_filter: node-a:0@node-b\n  deepspeed_exclusion_filter: none\n"
      "  deepspeed_multinode_launcher: pdsh\n",
      "accelerate.yaml");
  LaunchOptions opts;
  apply_launch_config(config, 0, opts);
  EXPECT_EQ(opts.hostfile, "/etc/lab_hosts");
  EXPECT_EQ(opts.include, "node-a:0@node-b");
  EXPECT_EQ(opts.exclude, "");
  EXPECT_FALSE(opts.node_rank_given) << "the head numbers the hosts from the file";
  EXPECT_EQ(opts.master_port, 29555);

  LaunchOptions flagged;  // a flag's filter wins over the file's
  flagged.exclude = "node-b";
  apply_launch_config(config, 0, flagged);
  EXPECT_EQ(flagged.include, "");
  EXPECT_EQ(flagged.exclude, "node-b");

  Config standard = config;  // each machine runs its own launcher, as with Accelerate
  standard.deepspeed_multinode_launcher = "standard";
  LaunchOptions each;
  apply_launch_config(standard, 0, each);
  EXPECT_EQ(each.hostfile, "");
  EXPECT_TRUE(each.node_rank_given);

  Config mpi = config;
  mpi.deepspeed_multinode_launcher = "openmpi";
  LaunchOptions refused;
  EXPECT_NE(usage_error_message([&] { apply_launch_config(mpi, 0, refused); })
                .find("deepspeed_multinode_launcher openmpi is not supported"),
            std::string::npos);
}

TEST(Hostfile, HostsTheHeadStartsDoNotReadTheConfigsHostfileAgain) {
  // The head passes its config file on to every host's launcher, with that
  // host's --node-rank and --include: the hostfile keys are the head's.
  const Config config = parse_config_text(
      "distributed_type: DEEPSPEED\nnum_machines: 2\nuse_cpu: true\n"
      "deepspeed_config:\n  deepspeed_hostfile: /etc/lab_hosts\n"
      "  deepspeed_inclusion_filter: node-a:0@node-b\n  deepspeed_multinode_launcher: pdsh\n",
      "accelerate.yaml");
  const char* argv[] = {"launch", "--env-from-stdin", "--nnodes", "2", "--node-rank", "1",
                        "--nproc-per-node", "1", "--include", "node-a:0@node-b:0",
                        "--master-addr", "node-a", "--master-port", "29555", "prog"};
  bool help = false;
  LaunchOptions host = parse_launch_flags(15, const_cast<char**>(argv), &help);
  apply_launch_config(config, 0, host);
  EXPECT_EQ(host.hostfile, "");
  EXPECT_EQ(host.include, "node-a:0@node-b:0");
  EXPECT_EQ(usage_error_message([&] { validate_launch_options(host); }), "");
}

}  // namespace
}  // namespace tandem::cli
