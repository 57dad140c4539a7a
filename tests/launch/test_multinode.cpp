// Multi-node and foreign-launcher runs: two network namespaces joined by a
// veth pair stand in for two machines; mpirun stands in for other launchers.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>

#include "support/reserved_port.h"
#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::run_process;

bool sh(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// Two namespaces "<tag>a" (10.231.7.1) and "<tag>b" (10.231.7.2); removed on
// destruction. ok() is false, with the reason in why(), without privilege.
class TwoHostNetwork {
 public:
  TwoHostNetwork() : a_("tnd" + std::to_string(::getpid()) + "a"), b_("tnd" + std::to_string(::getpid()) + "b") {
    if (!sh("command -v ip")) {
      why_ = "the ip tool (iproute2) is not installed";
      return;
    }
    if (!sh("ip netns add " + a_)) {
      why_ = "cannot create network namespaces (needs root or CAP_SYS_ADMIN)";
      return;
    }
    created_ = true;
    const std::string va = "v" + a_, vb = "v" + b_;
    ok_ = sh("ip netns add " + b_) && sh("ip link add " + va + " type veth peer name " + vb) &&
          sh("ip link set " + va + " netns " + a_) && sh("ip link set " + vb + " netns " + b_) &&
          sh("ip -n " + a_ + " addr add 10.231.7.1/24 dev " + va) &&
          sh("ip -n " + b_ + " addr add 10.231.7.2/24 dev " + vb) &&
          sh("ip -n " + a_ + " link set " + va + " up") && sh("ip -n " + b_ + " link set " + vb + " up") &&
          sh("ip -n " + a_ + " link set lo up") && sh("ip -n " + b_ + " link set lo up");
    if (!ok_) why_ = "cannot create a veth pair between namespaces";
  }
  ~TwoHostNetwork() {
    if (created_) {
      sh("ip netns del " + a_);
      sh("ip netns del " + b_);
    }
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::vector<std::string> in(const std::string& ns, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"ip", "netns", "exec", ns});
    return argv;
  }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

 private:
  std::string a_, b_, why_;
  bool created_ = false;
  bool ok_ = false;
};

TEST(MultiNode, TwoNamespacesFormOneWorldOfFour) {
  TwoHostNetwork net;
  if (!net.ok()) GTEST_SKIP() << "skipped: " << net.why();
  auto node = [&](int node_rank) {
    return std::vector<std::string>{bin("tandem"), "launch",       "--nnodes",     "2",
                                    "--node-rank", std::to_string(node_rank), "--nproc-per-node",
                                    "2",           "--master-addr", "10.231.7.1", "--master-port",
                                    "29631",       bin("launch_test_worker"), "allreduce"};
  };
  const std::string token = "TANDEM_STORE_TOKEN=" + std::string(64, '7');
  BackgroundProcess node0(net.in(net.a(), node(0)), {token});
  BackgroundProcess node1(net.in(net.b(), node(1)), {token});
  auto r0 = node0.wait(60);
  auto r1 = node1.wait(60);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  EXPECT_NE(r0.out.find("[rank1]: rank 1/4 allreduce ok sum=10"), std::string::npos) << r0.out;
  EXPECT_NE(r1.out.find("[rank2]: rank 2/4 allreduce ok sum=10"), std::string::npos) << r1.out;
  EXPECT_NE(r1.out.find("[rank3]: rank 3/4 allreduce ok sum=10"), std::string::npos) << r1.out;
}

TEST(MultiNode, LaunchWithoutAStoreTokenStopsBeforeAnyWorkerAndSaysHowToMakeOne) {
  ::unsetenv("TANDEM_STORE_TOKEN");  // the launcher inherits this process's environment
  auto r = run_process({bin("tandem"), "launch", "--nnodes", "2", "--node-rank", "1",
                        "--nproc-per-node", "1", "--master-addr", "10.231.7.1", "--master-port",
                        "29633", bin("launch_test_worker"), "allreduce"},
                       20);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("needs TANDEM_STORE_TOKEN"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("head -c 32 /dev/urandom"), std::string::npos) << r.err;
}

TEST(MultiNode, ANodeWithTheWrongTokenIsRefusedWithTheFix) {
  TwoHostNetwork net;
  if (!net.ok()) GTEST_SKIP() << "skipped: " << net.why();
  auto node = [&](int node_rank) {
    return std::vector<std::string>{bin("tandem"), "launch",       "--nnodes",     "2",
                                    "--node-rank", std::to_string(node_rank), "--nproc-per-node",
                                    "1",           "--master-addr", "10.231.7.1", "--master-port",
                                    "29635",       bin("launch_test_worker"), "allreduce"};
  };
  BackgroundProcess node0(net.in(net.a(), node(0)), {"TANDEM_STORE_TOKEN=" + std::string(64, 'a')});
  BackgroundProcess node1(net.in(net.b(), node(1)), {"TANDEM_STORE_TOKEN=" + std::string(64, 'b')});
  auto r1 = node1.wait(60);
  EXPECT_EQ(r1.exit_code, 1) << r1.out << r1.err;
  const std::string all = r1.out + r1.err;
  EXPECT_NE(all.find("token did not match"), std::string::npos) << all;
  EXPECT_NE(all.find("TANDEM_STORE_TOKEN must be the same on every node"), std::string::npos) << all;
  node0.send(SIGTERM);  // its rank 0 waits for the refused rank
  node0.wait(20);
}

TEST(ForeignLauncher, MpirunStartsAWorkingJob) {
  if (!sh("command -v mpirun")) GTEST_SKIP() << "skipped: mpirun (openmpi-bin) is not installed";
  // Rank 0 hosts the store on MASTER_PORT: a port held free for this test,
  // not a fixed number another job on the machine might be using.
  testing::ReservedPort reserved(/*shareable=*/true);
  ASSERT_NE(reserved.port(), 0);
  auto r = run_process({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                        "MASTER_ADDR=127.0.0.1", "-x",
                        "MASTER_PORT=" + std::to_string(reserved.port()),
                        bin("launch_test_worker"), "allreduce"},
                       60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0/2 allreduce ok sum=3 source=openmpi"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1/2 allreduce ok sum=3 source=openmpi"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem
