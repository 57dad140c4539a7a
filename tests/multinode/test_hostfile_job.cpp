// `tandem launch --hostfile`: one command on the first host starts the job on
// every host of a TestCluster over ssh (host_fanout.h).

#include <dirent.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "support/subprocess.h"
#include "support/test_cluster.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::TempDir;
using testing::TestCluster;

// A cluster of `hosts` with sshd on each, its hostfile (2 slots per host)
// in `dir`, and the ssh options the head needs for the cluster's keys.
struct SshCluster {
  explicit SshCluster(int hosts) : cluster(hosts) {
    if (!cluster.ok()) {
      why = cluster.why();
      return;
    }
    why = cluster.start_ssh();
    if (!why.empty()) return;
    hostfile = dir.path() + "/hosts";
    std::ofstream out(hostfile);
    out << "# the test cluster\n";
    for (int i = 0; i < hosts; ++i) out << cluster.address(i) << " slots=2\n";
  }

  // `tandem launch --hostfile` run on host 0.
  std::vector<std::string> head(int port, const std::vector<std::string>& program,
                                const std::string& ssh_options = "") const {
    std::vector<std::string> argv = {
        bin("tandem"), "launch", "--hostfile", hostfile, "--launcher-args",
        ssh_options + " -i " + cluster.ssh_dir() + "/client_key -l root -o "
            "StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o "
            "ConnectTimeout=5",
        "--master-port", std::to_string(port), "--grace-period", "2"};
    argv.insert(argv.end(), program.begin(), program.end());
    return cluster.on(0, argv);
  }

  // Processes left on the hosts other than their ssh servers.
  std::vector<pid_t> leftovers() const {
    std::vector<pid_t> out;
    for (int host = 0; host < cluster.size(); ++host) {
      for (pid_t pid : cluster.pids(host)) {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::string name;
        if (comm >> name && name != "sshd") out.push_back(pid);
      }
    }
    return out;
  }

  TestCluster cluster;
  TempDir dir;
  std::string why;
  std::string hostfile;
};

int count_files(const std::string& dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

double max_relative_diff(const std::string& a_path, const std::string& b_path) {
  SafetensorsReader a(a_path), b(b_path);
  EXPECT_EQ(a.entries().size(), b.entries().size());
  double worst = 0;
  for (const auto& entry : a.entries()) {
    const auto x = a.read(entry.name);
    const auto y = b.read(entry.name);
    const double scale = std::max(1e-6, y.abs().max().item<double>());
    worst = std::max(worst, (x - y).abs().max().item<double>() / scale);
  }
  return worst;
}

TEST(HostfileJob, ThreeHostsTrainTheQuickstartModelLikeOneProcess) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string one = c.dir.path() + "/one.safetensors";
  const std::string six = c.dir.path() + "/six.safetensors";
  // The same global batch (48): one process, then 3 hosts x 2 ranks.
  auto alone = testing::run_process({bin("quickstart_worker"), "40", "48", one}, 120);
  ASSERT_EQ(alone.exit_code, 0) << alone.out << alone.err;
  // Issue 31's command: `tandem launch --hostfile hosts --nproc-per-node 2 PROGRAM`.
  BackgroundProcess head(
      c.head(29661, {"--nproc-per-node", "2", bin("quickstart_worker"), "40", "48", six}));
  auto r = head.wait(180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string host0 = c.cluster.address(0);
  EXPECT_NE(r.out.find("[" + host0 + ":rank0]: {\"world\": 6, \"steps\": 40"), std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.err.find("tandem launch: 3 host(s) from " + c.hostfile + ", 6 process(es)"),
            std::string::npos)
      << r.err;
  const double diff = max_relative_diff(six, one);
  EXPECT_LE(diff, 1e-5) << "3 hosts x 2 ranks against one process";
  std::printf("hostfile job: largest relative difference to one process %.3g\n", diff);
  EXPECT_TRUE(c.leftovers().empty()) << "processes left on the hosts";
}

TEST(HostfileJob, AFailureOnOneHostStopsEveryHostAndNamesIt) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  // Rank 4 (the third host's first) exits with 7; the others hang until stopped.
  BackgroundProcess head(c.head(29663, {bin("launch_test_worker"), "exit", "7", "4"}));
  auto r = head.wait(120);
  // The host's launcher exits 1 for a failed job, as on one host (and as
  // torchrun); its root cause comes labelled with the host.
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::string host2 = c.cluster.address(2);
  EXPECT_NE(r.err.find("[" + host2 + "]: tandem launch: job failed. Root cause: rank 4 (pid "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exited with code 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("host " + host2 + " (node 2, ranks 4-5) failed with exit code 1; stopped "
                       "the other hosts"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(c.leftovers().empty()) << "processes left on the hosts";
}

// A job of six ranks of launch_test_worker's `mode` (each writes its pid
// into `pids` once all have met); returns when all six have.
std::unique_ptr<BackgroundProcess> start_job(const SshCluster& c, int port,
                                             const std::string& pids, const std::string& mode,
                                             std::vector<std::string> env = {},
                                             const std::string& ssh_options = "") {
  env.push_back("TANDEM_TEST_PID_DIR=" + pids);
  auto head = std::make_unique<BackgroundProcess>(
      c.head(port, {bin("launch_test_worker"), mode}, ssh_options), env);
  EXPECT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120))
      << "the six ranks did not all start";
  return head;
}

TEST(HostfileFaults, KillingEveryProcessOfOneHostStopsTheJobAndNamesIt) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  auto head = start_job(c, 29669, pids, "allreduce-then-hang");
  ASSERT_TRUE(c.cluster.kill_host(2)) << "host 2 did not die";
  auto r = head->wait(60);
  EXPECT_EQ(r.exit_code, 255) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + c.cluster.address(2) + " (node 2, ranks 4-5) failed with exit "
                       "code 255 (ssh could not reach the host, or lost it)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(c.leftovers().empty()) << "processes left on the surviving hosts";
}

TEST(HostfileFaults, AHostWhoseLinkGoesDownStopsTheJobAndNamesIt) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  // Ranks all-reducing every 50 ms, as training does. ssh's keepalive
  // notices the silent host (every 2 s, twice: --launcher-args win over
  // tandem's 5 s x 3) before the collectives' timeout, as it would before
  // the default 600 s. TANDEM_TIMEOUT_S travels too: the cut-off host's
  // ranks give up after 12 s, and their launcher then stops.
  auto head = start_job(c, 29671, pids, "allreduce-loop", {"TANDEM_TIMEOUT_S=12"},
                        "-o ServerAliveInterval=2 -o ServerAliveCountMax=2");
  ASSERT_TRUE(c.cluster.set_link(2, false));
  auto r = head->wait(60);
  EXPECT_EQ(r.exit_code, 255) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + c.cluster.address(2) + " (node 2, ranks 4-5) failed with exit "
                       "code 255"),
            std::string::npos)
      << r.err;
  EXPECT_LT(r.seconds, 20) << "the lost host was noticed late";
  // The surviving hosts stop at once; the cut-off host's launcher stops when
  // its ranks time out.
  const auto stopped = std::chrono::steady_clock::now();
  for (pid_t pid : c.leftovers()) EXPECT_TRUE(testing::wait_for_exit(pid, 45)) << "pid " << pid;
  std::printf("link down: head exited after %.1f s, the cut-off host's processes %.1f s later\n",
              r.seconds,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count());
}

TEST(HostfileRestarts, AFailedRankRestartsEveryHost) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  // Restart 0: rank 4 exits with 3. Restart 1 (TANDEM_RESTART_COUNT=1 on
  // every host): all six all-reduce.
  BackgroundProcess head(c.head(29673, {"--max-restarts", "1", bin("launch_test_worker"),
                                        "exit-on-first-attempt", "3", "4"}));
  auto r = head.wait(120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("(node 2, ranks 4-5) failed with exit code 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the job (restart 1 of 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("3 host(s) from " + c.hostfile + ", 6 process(es), store on " +
                       c.cluster.address(0) + ":29673 (restart 1)"),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + "/6 allreduce ok sum=21"),
              std::string::npos)
        << r.out;
  }
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, ALostHostIsLeftOutWhileAtLeastMinHostsAnswer) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  BackgroundProcess head(c.head(29675, {"--nnodes", "2:3", "--max-restarts", "1",
                                        bin("launch_test_worker"), "loop-on-first-attempt"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120));
  ASSERT_TRUE(c.cluster.kill_host(2));
  auto r = head.wait(120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + c.cluster.address(2) + " does not answer ssh; leaving it out"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("2 host(s) from " + c.hostfile + ", 4 process(es)"), std::string::npos)
      << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + "/4 allreduce ok sum=10"),
              std::string::npos)
        << r.out;
  }
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, LosingAHostResumesFromTheLastCheckpointOnTheOthers) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids", ckpt = c.dir.path() + "/ckpt";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  const std::string one = c.dir.path() + "/one.safetensors";
  const std::string elastic = c.dir.path() + "/elastic.safetensors";
  auto alone = testing::run_process({bin("quickstart_worker"), "40", "48", one}, 120);
  ASSERT_EQ(alone.exit_code, 0) << alone.out << alone.err;
  // 3 hosts x 2 ranks save every 10 steps and stop after step 20's
  // checkpoint; host 2 dies; the job restarts on 2 hosts x 2 ranks from that
  // checkpoint (the same global batch of 48: 12 per rank instead of 8).
  BackgroundProcess head(c.head(29679, {"--nnodes", "2:3", "--max-restarts", "1",
                                        bin("quickstart_worker"), "40", "48", elastic, ckpt,
                                        "10"}),
                         {"TANDEM_TEST_PID_DIR=" + pids, "TANDEM_TEST_HANG_AFTER_STEP=20"});
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120));
  ASSERT_TRUE(c.cluster.kill_host(2));
  auto r = head.wait(180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string host0 = c.cluster.address(0);
  EXPECT_NE(r.out.find("[" + host0 + ":rank0]: resumed at step 20 on 4 ranks"), std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find("[" + host0 + ":rank0]: {\"world\": 4, \"steps\": 40"), std::string::npos)
      << r.out;
  const double diff = max_relative_diff(elastic, one);
  EXPECT_LE(diff, 1e-5) << "6 ranks, a lost host, then 4 ranks, against one process";
  std::printf("lost host, resumed on 4 ranks: largest relative difference %.3g\n", diff);
  EXPECT_TRUE(c.leftovers().empty());
}

// Issue 31's fault 6: kill one host, go on with two, let it come back and
// finish on three.
TEST(HostfileRestarts, AHostThatComesBackRejoinsAtTheNextRestart) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  // Restarts 0 and 1 all-reduce until stopped; restart 2 all-reduces once.
  BackgroundProcess head(c.head(29681, {"--nnodes", "2:3", "--max-restarts", "2",
                                        bin("launch_test_worker"), "loop-until-restart", "2"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120));
  ASSERT_EQ(std::system(("rm -f " + pids + "/*").c_str()), 0);
  ASSERT_TRUE(c.cluster.kill_host(2));
  // Restart 1: the two hosts left, four ranks.
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 4; }, 120))
      << "the job did not go on without host 2";
  ASSERT_EQ(c.cluster.restart_ssh(2), "");
  // A rank fails: restart 2 finds host 2 answering again.
  std::ifstream rank0(pids + "/rank0.pid");
  pid_t victim = 0;
  ASSERT_TRUE(rank0 >> victim);
  ::kill(victim, SIGKILL);
  auto r = head.wait(120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("2 host(s) from " + c.hostfile + ", 4 process(es), store on " +
                       c.cluster.address(0) + ":29681 (restart 1)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("3 host(s) from " + c.hostfile + ", 6 process(es), store on " +
                       c.cluster.address(0) + ":29681 (restart 2)"),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + "/6 allreduce ok sum=21"),
              std::string::npos)
        << r.out;
  }
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, KeepGlobalBatchScalesAccumulationToTheRanksLeft) {
  SshCluster c(2);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  // 4 ranks x 3 accumulation steps; after host 1 is lost, 2 ranks x 6.
  BackgroundProcess head(c.head(29683, {"--nnodes", "1:2", "--max-restarts", "1",
                                        "--keep-global-batch", bin("launch_test_worker"),
                                        "loop-on-first-attempt", "config"}),
                         {"TANDEM_TEST_PID_DIR=" + pids, "TANDEM_GRADIENT_ACCUMULATION_STEPS=3"});
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 4; }, 120));
  ASSERT_TRUE(c.cluster.kill_host(1));
  auto r = head.wait(120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("--keep-global-batch: gradient accumulation 6 on 2 ranks (3 on 4)"),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + "/2 mixed_precision=no file= "
                         "accumulation=6"),
              std::string::npos)
        << r.out;
  }
}

TEST(HostfileRestarts, KeepGlobalBatchStopsWhenTheBatchCannotSplit) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  BackgroundProcess head(c.head(29685, {"--nnodes", "2:3", "--max-restarts", "1",
                                        "--keep-global-batch", bin("launch_test_worker"),
                                        "loop-on-first-attempt"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120));
  ASSERT_TRUE(c.cluster.kill_host(2));
  auto r = head.wait(120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("--keep-global-batch: 1 accumulation step(s) x 6 ranks = 6 micro-batches "
                       "per step do not split over the 4 ranks left; stopping"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, AnElasticJobStartsOnTheHostsThatAnswer) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  ASSERT_TRUE(c.cluster.kill_host(1));  // down before the job starts
  BackgroundProcess head(
      c.head(29687, {"--nnodes", "2:3", bin("launch_test_worker"), "allreduce"}));
  auto r = head.wait(120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + c.cluster.address(1) + " does not answer ssh; leaving it out"),
            std::string::npos)
      << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + "/4 allreduce ok sum=10"),
              std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.out.find("[" + c.cluster.address(2) + ":rank3]: "), std::string::npos) << r.out;
}

TEST(HostfileRestarts, FewerHostsThanMinEndTheJob) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  BackgroundProcess head(c.head(29677, {"--nnodes", "3:3", "--max-restarts", "2",
                                        bin("launch_test_worker"), "loop-on-first-attempt"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120));
  ASSERT_TRUE(c.cluster.kill_host(1));
  auto r = head.wait(120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("2 of 3 hosts answer, fewer than the 3 --nnodes asks for; giving up"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(c.leftovers().empty());
}

// Starts a job whose six ranks hang once they have met, stops the head
// with `sig`, and expects every process on every host gone.
void stop_the_head_and_expect_no_process_left(int sig, int port) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.dir.path() + "/pids";
  ASSERT_EQ(::mkdir(pids.c_str(), 0755), 0);
  // TANDEM_* travels to every host: each rank writes its pid there once
  // the whole world has met, then hangs.
  const std::string token(64, 'c');
  BackgroundProcess head(c.head(port, {bin("launch_test_worker"), "allreduce-then-hang"}),
                         {"TANDEM_TEST_PID_DIR=" + pids, "TANDEM_STORE_TOKEN=" + token});
  const bool met = testing::wait_for_files(pids, [&] { return count_files(pids) == 6; }, 120);
  ASSERT_TRUE(met) << "the six ranks did not all start";
  const std::vector<pid_t> running = c.leftovers();
  ASSERT_GE(running.size(), 6u + 3u) << "six workers and three host launchers at least";
  // The token reached every host through ssh's stdin, never a command line.
  for (pid_t pid : running) {
    std::ifstream cmdline("/proc/" + std::to_string(pid) + "/cmdline");
    const std::string text((std::istreambuf_iterator<char>(cmdline)), {});
    EXPECT_EQ(text.find(token), std::string::npos) << "the token is on pid " << pid << "'s "
                                                   << "command line";
  }
  head.send(sig);
  auto r = head.wait(30);
  if (sig != SIGKILL) EXPECT_EQ(r.exit_code, 128 + sig) << r.out << r.err;
  // Each ssh ends with the head (killed with it, or stopped by it); each
  // host's launcher sees its stdin close and stops its workers (SIGTERM,
  // then SIGKILL after --grace-period 2).
  for (pid_t pid : running) {
    EXPECT_TRUE(testing::wait_for_exit(pid, 30)) << "process " << pid << " outlived the head";
  }
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileJob, KillingTheHeadWithSigkillLeavesNoProcessOnAnyHost) {
  stop_the_head_and_expect_no_process_left(SIGKILL, 29665);
}

TEST(HostfileJob, CtrlCOnTheHeadStopsEveryHost) {
  stop_the_head_and_expect_no_process_left(SIGINT, 29667);
}

}  // namespace
}  // namespace tandem
