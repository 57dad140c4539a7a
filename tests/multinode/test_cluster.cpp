// The test cluster itself (tests/support/test_cluster.h): hosts reach each
// other and nothing else, links can be shaped and cut, a host can die, and
// nothing is left behind, not even by a test that crashed.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/test_cluster.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::run_process;
using testing::TestCluster;

#ifndef TANDEM_PEER_PYTHON
#define TANDEM_PEER_PYTHON ""
#endif

std::string python() {
  const std::string peer = TANDEM_PEER_PYTHON;
  return peer.empty() ? "python3" : peer;
}

std::string probe() { return std::string(TANDEM_SOURCE_DIR) + "/tests/multinode/link_probe.py"; }

std::string shell_output(const std::string& command) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  char buffer[512];
  while (pipe && std::fgets(buffer, sizeof buffer, pipe.get())) out += buffer;
  return out;
}

// A FIFO a process on a host writes a line to once it is ready.
class ReadySignal {
 public:
  ReadySignal() : path_(dir_.path() + "/ready") {
    ::mkfifo(path_.c_str(), 0600);
    fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  }
  ~ReadySignal() { ::close(fd_); }
  const std::string& path() const { return path_; }
  // Whether a line came within `timeout_ms`.
  bool wait(int timeout_ms) {
    pollfd readable{fd_, POLLIN, 0};
    char byte = 0;
    return ::poll(&readable, 1, timeout_ms) == 1 && ::read(fd_, &byte, 1) == 1;
  }

 private:
  testing::TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

// A listener on `host`, port 29700 (TCP and UDP), listening when this
// returns, until the returned process goes.
std::unique_ptr<BackgroundProcess> listen_on(const TestCluster& cluster, int host) {
  ReadySignal ready;
  auto listener = std::make_unique<BackgroundProcess>(
      cluster.on(host, {python(), probe(), "listen", "29700", ready.path()}));
  EXPECT_TRUE(ready.wait(10000)) << "the listener on host " << host << " did not start";
  return listener;
}

// Seconds a TCP connect from `from` to `to` took, or a negative number when
// it failed within `limit` seconds.
double connect_seconds(const TestCluster& cluster, int from, int to, double limit) {
  auto r = run_process(
      cluster.on(from, {python(), probe(), "connect", cluster.address(to), "29700",
                        std::to_string(limit)}),
      limit + 30);
  if (r.exit_code != 0) return -1;
  return std::stod(r.out);
}

// Seconds `bytes` took over TCP from `from` to `to`, arriving intact, or a
// negative number when they did not.
double transfer_seconds(const TestCluster& cluster, int from, int to, int bytes) {
  auto r = run_process(cluster.on(from, {python(), probe(), "transfer", cluster.address(to),
                                         "29700", std::to_string(bytes), "30"}),
                       60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? std::stod(r.out) : -1;
}

// How many of `count` UDP datagrams from `from` came back from `to`'s echo.
int datagrams_echoed(const TestCluster& cluster, int from, int to, int count) {
  auto r = run_process(cluster.on(from, {python(), probe(), "datagrams", cluster.address(to),
                                         "29700", std::to_string(count)}),
                       30);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? std::stoi(r.out) : -1;
}

TEST(TestCluster, EveryHostReachesEveryOtherAndTheRootNamespaceIsUntouched) {
  const std::string root_links = shell_output("ip -o link show | cut -d: -f2");
  {
    TestCluster cluster(3);
    if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
    ASSERT_EQ(cluster.size(), 3);
    EXPECT_EQ(cluster.address(2), "10.231.0.3");
    std::vector<std::unique_ptr<BackgroundProcess>> listeners;
    for (int host = 0; host < 3; ++host) listeners.push_back(listen_on(cluster, host));
    for (int from = 0; from < 3; ++from) {
      for (int to = 0; to < 3; ++to) {
        EXPECT_GE(connect_seconds(cluster, from, to, 10), 0) << from << " -> " << to;
      }
    }
    // A host sees only its loopback and its link.
    const std::string links = shell_output("ip -n " + cluster.name(1) + " -o link show");
    EXPECT_NE(links.find("lo:"), std::string::npos) << links;
    EXPECT_NE(links.find("eth0@"), std::string::npos) << links;
    EXPECT_EQ(std::count(links.begin(), links.end(), '\n'), 2) << links;
    EXPECT_EQ(shell_output("ip -o link show | cut -d: -f2"), root_links)
        << "the cluster added an interface to the root namespace";
  }
  EXPECT_EQ(shell_output("ip netns list | grep -c '^tnd" + std::to_string(::getpid()) + "c'"),
            "0\n")
      << "the destructor left namespaces: " << shell_output("ip netns list");
}

// Where the kernel has no netem (this project's CI), shape() puts a relay
// (tests/support/link_relay.py) on the link: these tests then check it.
TEST(TestCluster, AShapedLinkDelaysBothDirections) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string no_shaping = cluster.why_no_shaping();
  if (!no_shaping.empty()) GTEST_SKIP() << "skipped: " << no_shaping;
  auto listener = listen_on(cluster, 1);
  const double plain = connect_seconds(cluster, 0, 1, 10);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(cluster.shape(1, "delay 150ms"), "");
  // The SYN waits on the way in to host 1, the SYN-ACK on the way out.
  const double shaped = connect_seconds(cluster, 0, 1, 10);
  EXPECT_GE(shaped, 0.29) << "plain " << plain;
  EXPECT_LT(shaped, 1.0) << "a lost SYN (1 s to retry) on a link that only delays";
  EXPECT_LT(plain, 0.1);
  // Bulk data (64 KiB TSO frames on veth, checksums left to fill in)
  // crosses the shaped link intact.
  EXPECT_GE(transfer_seconds(cluster, 0, 1, 1 << 20), 0.29);
  ASSERT_EQ(cluster.shape(1, ""), "");
  const double again = connect_seconds(cluster, 0, 1, 10);
  EXPECT_GE(again, 0);
  EXPECT_LT(again, 0.1) << "removing the shaping restores the link";
  EXPECT_TRUE(cluster.switch_pids().empty()) << "the plain link still has a relay";
  std::printf("connect: plain %.4f s, delay 150ms %.4f s, restored %.4f s\n", plain, shaped,
              again);
}

TEST(TestCluster, ALossyLinkDropsDatagramsButTcpDeliversEveryByte) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string no_shaping = cluster.why_no_shaping();
  if (!no_shaping.empty()) GTEST_SKIP() << "skipped: " << no_shaping;
  auto listener = listen_on(cluster, 1);
  EXPECT_EQ(datagrams_echoed(cluster, 0, 1, 200), 200) << "the plain link lost datagrams";
  ASSERT_EQ(cluster.shape(1, "loss 10%"), "");
  // A round trip survives with 0.9 x 0.9: 38 of 200 lost on average, 5.5
  // either way; the bounds are more than 5 of those away.
  const int lost = 200 - datagrams_echoed(cluster, 0, 1, 200);
  EXPECT_GE(lost, 10);
  EXPECT_LE(lost, 80);
  const double seconds = transfer_seconds(cluster, 0, 1, 4 << 20);
  EXPECT_GE(seconds, 0) << "TCP did not get 4 MiB across a 10% lossy link";
  ASSERT_EQ(cluster.shape(1, ""), "");
  EXPECT_EQ(datagrams_echoed(cluster, 0, 1, 200), 200) << "the restored link lost datagrams";
  std::printf("loss 10%%: %d of 200 round trips lost; 4 MiB over TCP in %.3f s\n", lost, seconds);
}

TEST(TestCluster, ARateLimitedLinkCarriesNoMoreThanItsRate) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string no_shaping = cluster.why_no_shaping();
  if (!no_shaping.empty()) GTEST_SKIP() << "skipped: " << no_shaping;
  auto listener = listen_on(cluster, 1);
  ASSERT_EQ(cluster.shape(1, "rate 20mbit"), "");
  // 2 MiB is 16.8 Mbit before headers: at least 0.84 s at 20 Mbit/s.
  const double seconds = transfer_seconds(cluster, 0, 1, 2 << 20);
  EXPECT_GE(seconds, 0.84);
  EXPECT_LT(seconds, 5) << "far slower than 20 Mbit/s";
  std::printf("rate 20mbit: 2 MiB over TCP in %.3f s\n", seconds);
}

TEST(TestCluster, AShapeOtherThanDelayLossAndRateIsRefusedAndTheLinkStaysPlain) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  const std::string no_shaping = cluster.why_no_shaping();
  if (!no_shaping.empty()) GTEST_SKIP() << "skipped: " << no_shaping;
  auto listener = listen_on(cluster, 1);
  EXPECT_EQ(cluster.shape(1, "delay 10ms duplicate 1%"),
            "cannot shape a link with \"duplicate\" (in \"delay 10ms duplicate 1%\"): shape() "
            "takes delay, loss and rate only");
  const std::string bad_value = cluster.shape(1, "delay soon");
  EXPECT_NE(bad_value.find("delay soon"), std::string::npos) << bad_value;
  const double plain = connect_seconds(cluster, 0, 1, 10);
  EXPECT_GE(plain, 0);
  EXPECT_LT(plain, 0.1);
  EXPECT_TRUE(cluster.switch_pids().empty());
}

TEST(TestCluster, TheRelayOfAShapedLinkGoesWithTheCluster) {
  std::vector<pid_t> relays;
  {
    TestCluster cluster(2);
    if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
    const std::string no_shaping = cluster.why_no_shaping();
    if (!no_shaping.empty()) GTEST_SKIP() << "skipped: " << no_shaping;
    ASSERT_EQ(cluster.shape(0, "delay 5ms"), "");
    ASSERT_EQ(cluster.shape(1, "loss 1%"), "");
    relays = cluster.switch_pids();
    if (relays.empty()) GTEST_SKIP() << "skipped: tc netem shapes these links, with no process";
    EXPECT_EQ(relays.size(), 2u) << "one relay per shaped link";
  }
  for (pid_t pid : relays) EXPECT_FALSE(testing::process_alive(pid)) << "relay " << pid;
}

TEST(TestCluster, ALinkDownCutsTheHostOffUntilItComesBack) {
  TestCluster cluster(3);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  auto listener = listen_on(cluster, 2);
  ASSERT_GE(connect_seconds(cluster, 0, 2, 10), 0);
  ASSERT_TRUE(cluster.set_link(2, false));
  EXPECT_LT(connect_seconds(cluster, 0, 2, 1.5), 0) << "host 2 still answers with its link down";
  EXPECT_LT(connect_seconds(cluster, 1, 2, 1.5), 0);
  ASSERT_TRUE(cluster.set_link(2, true));
  EXPECT_GE(connect_seconds(cluster, 0, 2, 10), 0) << "host 2 is back";
}

TEST(TestCluster, KillingAHostLeavesNoProcessOnItAndSparesTheOthers) {
  TestCluster cluster(2);
  if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
  ReadySignal doomed_ready, survivor_ready;
  // The two sleeps are forked before the line is written.
  BackgroundProcess doomed(cluster.on(
      0, {"sh", "-c", "sleep 60 & sleep 60 & echo > " + doomed_ready.path() + "; wait"}));
  BackgroundProcess survivor(
      cluster.on(1, {"sh", "-c", "echo > " + survivor_ready.path() + "; exec sleep 60"}));
  ASSERT_TRUE(doomed_ready.wait(10000));
  ASSERT_TRUE(survivor_ready.wait(10000));
  ASSERT_EQ(cluster.pids(0).size(), 3u) << "sh and its two sleeps";
  EXPECT_TRUE(cluster.kill_host(0)) << "a process outlived SIGKILL by 10 s";
  auto r = doomed.wait(10);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_TRUE(cluster.pids(0).empty()) << "a process survived on the killed host";
  EXPECT_EQ(cluster.pids(1).size(), 1u) << "the other host's process must live on";
}

TEST(TestCluster, EveryHostServesSshWithTheTestsOwnKeysOnly) {
  std::string keys;
  {
    TestCluster cluster(2);
    if (!cluster.ok()) GTEST_SKIP() << "skipped: " << cluster.why();
    const std::string no_ssh = cluster.start_ssh();
    if (no_ssh.find("no ssh server") == 0) GTEST_SKIP() << "skipped: " << no_ssh;
    ASSERT_EQ(no_ssh, "");
    keys = cluster.ssh_dir();
    // From host 0, a command runs on host 1: it sees host 1's address.
    auto r = run_process(
        cluster.on(0, cluster.ssh(1, {"ip", "-o", "-4", "addr", "show", "eth0"})), 30);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(cluster.address(1) + "/24"), std::string::npos) << r.out;
    // A key the cluster did not make is refused.
    const std::string stranger = keys + "/stranger";
    ASSERT_EQ(std::system(("ssh-keygen -q -t ed25519 -N '' -f " + stranger).c_str()), 0);
    auto refused = cluster.ssh(1, {"true"});
    refused[2] = stranger;  // "-i" KEY
    auto denied = run_process(cluster.on(0, refused), 30);
    EXPECT_EQ(denied.exit_code, 255) << denied.out << denied.err;
  }
  EXPECT_NE(std::system(("test -e " + keys).c_str()), 0) << keys << " outlived the cluster";
}

TEST(TestCluster, TheNamespacesOfACrashedTestGoWithTheNextCluster) {
  {
    TestCluster probe_privilege(1);
    if (!probe_privilege.ok()) GTEST_SKIP() << "skipped: " << probe_privilege.why();
  }
  const pid_t child = ::fork();
  if (child == 0) {
    auto* leaked = new TestCluster(2);  // never destroyed: the test "crashes"
    ::_exit(leaked->ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const std::string pattern = "'^tnd" + std::to_string(child) + "c'";
  ASSERT_EQ(shell_output("ip netns list | grep -c " + pattern), "3\n")
      << "the crashed owner's switch and two hosts";
  TestCluster next(1);
  ASSERT_TRUE(next.ok()) << next.why();
  EXPECT_EQ(shell_output("ip netns list | grep -c " + pattern), "0\n")
      << shell_output("ip netns list");
}

}  // namespace
}  // namespace tandem
