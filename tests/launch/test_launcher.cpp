// `tandem launch` end to end, with real processes.

#include <gtest/gtest.h>

#include <sched.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <set>

#include "support/launch_testing.h"
#include "support/proc_net.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::launch;
using testing::none_alive;
using testing::wait_for_pids;
using testing::read_file;
using testing::run_process;
using testing::TempDir;

std::string worker() { return bin("launch_test_worker"); }

TEST(Launch, PrintsEveryRankWithTheWorldSize) {
  auto r = run_process(launch({"--nproc-per-node", "4", "/bin/sh", "-c", "echo $RANK $WORLD_SIZE"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string line = "[rank" + std::to_string(rank) + "]: " + std::to_string(rank) + " 4\n";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

TEST(Launch, SetsTheTorchrunEnvironmentContract) {
  auto r = run_process(
      launch({"--nproc_per_node=2", "--no-prefix", "/bin/sh", "-c",
              "echo $RANK,$LOCAL_RANK,$WORLD_SIZE,$LOCAL_WORLD_SIZE,$GROUP_RANK,$MASTER_ADDR,"
              "$TORCHELASTIC_USE_AGENT_STORE,$TORCHELASTIC_RESTART_COUNT,$OMP_NUM_THREADS"}),
      30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0,0,2,2,0,127.0.0.1,True,0,1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1,1,2,2,0,127.0.0.1,True,0,1\n"), std::string::npos) << r.out;
}

// torchrun's run id: --rdzv-id, "none" by default. --rdzv-timeout and
// --rdzv-conf tune only nodes that meet at the store to agree on ranks;
// anywhere else they are accepted with a warning, never silently.
TEST(Launch, RdzvIdReachesTheWorkersAndRendezvousTuningOutsideItIsWarned) {
  auto plain = run_process(launch({"--nproc-per-node", "1", "--no-prefix", "/bin/sh", "-c",
                                   "echo run=$TORCHELASTIC_RUN_ID"}),
                           30);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("run=none\n"), std::string::npos) << plain.out;
  EXPECT_EQ(plain.err.find("no effect"), std::string::npos) << plain.err;
  auto tuned = run_process(launch({"--nproc-per-node", "1", "--no-prefix", "--rdzv-id", "job7",
                                   "--rdzv-timeout", "5", "/bin/sh", "-c",
                                   "echo run=$TORCHELASTIC_RUN_ID"}),
                           30);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.err;
  EXPECT_NE(tuned.out.find("run=job7\n"), std::string::npos) << tuned.out;
  EXPECT_NE(tuned.err.find("--rdzv-timeout and --rdzv-conf have no effect here"),
            std::string::npos)
      << tuned.err;
}

// torchrun's --local-ranks-filter: the console shows only the named local
// ranks; --log-dir still keeps every rank's output.
TEST(Launch, LocalRanksFilterShowsOnlyTheNamedRanks) {
  TempDir logs;
  auto r = run_process(launch({"--nproc-per-node", "3", "--local-ranks-filter", "0,2",
                               "--log-dir", logs.path(), "/bin/sh", "-c",
                               "echo out $LOCAL_RANK; echo err $LOCAL_RANK >&2"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[rank0]: out 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank2]: out 2"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("out 1"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("err 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("err 2"), std::string::npos) << r.err;
  EXPECT_EQ(read_file(logs.path() + "/attempt_0/rank_1/stdout.log"), "out 1\n");
}

// The CPUs this test may run on, ascending.
std::vector<int> test_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// accelerate launch's training flags reach the workers as TANDEM_*
// variables (which resolve_config reads); deepspeed's --bind_cores_to_rank
// pins each worker to its own share of --bind_core_list and sets
// OMP_NUM_THREADS to its size.
TEST(Launch, AccelerateTrainingFlagsAndCoreBindingReachTheWorkers) {
  const std::vector<int> cpus = test_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs to give 2 workers one each";
  const std::string a = std::to_string(cpus[0]);
  const std::string b = std::to_string(cpus[1]);
  auto r = run_process(
      launch({"--nproc-per-node", "2", "--no-prefix", "--use_deepspeed", "--zero_stage", "3",
              "--offload_optimizer_device", "cpu", "--gradient_clipping", "0.5",
              "--gradient_accumulation_steps", "2", "--bind_cores_to_rank", "--bind_core_list",
              a + "," + b, "/bin/sh", "-c",
              "echo $LOCAL_RANK $TANDEM_ZERO_STAGE $TANDEM_OFFLOAD_OPTIMIZER_DEVICE "
              "$TANDEM_GRADIENT_CLIPPING $TANDEM_GRADIENT_ACCUMULATION_STEPS $OMP_NUM_THREADS "
              "$(grep Cpus_allowed_list /proc/self/status | tr -d '\t ')"}),
      30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0 3 cpu 0.5 2 1 Cpus_allowed_list:" + a + "\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 3 cpu 0.5 2 1 Cpus_allowed_list:" + b + "\n"), std::string::npos)
      << r.out;
}

// A --bind-core-list that cannot give each local rank cores of its own (a
// core the launcher may not use, one listed twice, fewer cores than ranks)
// is refused before any worker starts, naming the core, as deepspeed
// refuses it; before, the workers ran unpinned or shared a core.
TEST(Launch, BindCoreListThatCannotGiveEachRankItsOwnCoresIsRefused) {
  const std::vector<int> cpus = test_cpus();
  ASSERT_FALSE(cpus.empty());
  const std::string first = std::to_string(cpus[0]);
  auto refused = [&](const std::string& list, const std::string& why) {
    auto r = run_process(launch({"--nproc-per-node", "2", "--bind-cores-to-rank",
                                 "--bind-core-list", list, "/bin/sh", "-c", "echo worker ran"}),
                         30);
    EXPECT_EQ(r.exit_code, 2) << list << ": " << r.err;
    EXPECT_NE(r.err.find(why), std::string::npos) << list << ": " << r.err;
    EXPECT_EQ(r.out.find("worker ran"), std::string::npos) << list << ": " << r.out;
  };
  refused("1023", "--bind-core-list 1023: core 1023 is not one this launcher may run on");
  refused(first + "," + first, "core " + first + " is listed twice");
  refused(first, "--bind-core-list " + first + ": 1 core(s) for 2 local ranks; each rank needs "
                 "at least one core of its own");
}

// Rank 1 fails; rank 0 ignores the launcher's SIGTERM, so the launcher
// waits out its grace period, and a SIGTERM to the launcher then ends it
// (143). The failure that began the stop is still the reported cause.
TEST(Launch, ASignalDuringAFailuresGracePeriodStillReportsTheFailure) {
  TempDir dir;
  const std::string d = dir.path();
  BackgroundProcess job(launch(
      {"--nproc-per-node", "2", "--grace-period", "4", "/bin/sh", "-c",
       "if [ $RANK = 1 ]; then while [ ! -e " + d + "/ready ]; do sleep 0.05; done; exit 3; fi; "
       "trap 'touch " + d + "/term' TERM; touch " + d + "/ready; while :; do sleep 0.05; done"}));
  // rank 0 has its SIGTERM: the launcher is stopping the workers.
  ASSERT_TRUE(testing::wait_for_files(
      d, [&] { return ::access((d + "/term").c_str(), F_OK) == 0; }, 30));
  job.send(SIGTERM);
  auto r = job.wait(30);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM; stopped all 2 workers"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Before it, the job had failed: Root cause: rank 1"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
}

TEST(Launch, FourRanksAllReduce) {
  auto r = run_process(launch({"--nproc-per-node", "4", "--standalone", worker(), "allreduce"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string line = "rank " + std::to_string(rank) + "/4 allreduce ok sum=10";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

// Slurm's warning signal (`sbatch --signal=B:USR1@T`) reaches the launcher:
// it passes SIGUSR1 to every worker and goes on (before, SIGUSR1 ended it);
// workers that stop for preemption (exit 75, kPreemptedExitCode) end the
// launch with 75: not a failure, and no restart despite --max-restarts.
TEST(Launch, ForwardsUsr1AndPassesOnThePreemptedExitCode) {
  TempDir dir;
  BackgroundProcess job(launch({"--nproc-per-node", "2", "--max-restarts", "2", "/bin/sh", "-c",
                                "trap 'echo usr1 $RANK; exit 75' USR1; touch " + dir.path() +
                                    "/$RANK; while :; do sleep 0.05; done"}));
  ASSERT_TRUE(testing::wait_for_files(
      dir.path(), [&] { return ::access((dir.path() + "/1").c_str(), F_OK) == 0 &&
                               ::access((dir.path() + "/0").c_str(), F_OK) == 0; },
      30));
  ::kill(job.pid(), SIGUSR1);
  auto r = job.wait(30);
  EXPECT_EQ(r.exit_code, 75) << r.out << r.err;
  for (const std::string rank : {"0", "1"}) {
    const std::string line = "[rank" + rank + "]: usr1 " + rank + "\n";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(line), r.out.rfind(line)) << "restarted:\n" << r.out;
  }
  EXPECT_NE(r.err.find("stopped for preemption after saving a checkpoint (exit code 75)"),
            std::string::npos)
      << r.err;
}

TEST(Launch, BadInputExitsWithCodeTwoAndSaysWhy) {
  auto missing = run_process(launch({"--nproc-per-node", "2"}), 10);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("missing PROGRAM"), std::string::npos) << missing.err;

  auto not_found = run_process(launch({"./no/such/program"}), 10);
  EXPECT_EQ(not_found.exit_code, 2);
  EXPECT_NE(not_found.err.find("'./no/such/program' was not found"), std::string::npos);
  // A path is checked as a path; a bare name is looked up on PATH.
  auto no_path = run_process(launch({"build/nonexistent"}), 10);
  EXPECT_EQ(no_path.exit_code, 2);
  EXPECT_NE(no_path.err.find("'build/nonexistent' was not found or is not executable; check the "
                             "path"),
            std::string::npos)
      << no_path.err;
  EXPECT_EQ(no_path.err.find("bin/build"), std::string::npos) << no_path.err;
  auto no_name = run_process(launch({"tandem-no-such-program"}), 10);
  EXPECT_EQ(no_name.exit_code, 2);
  EXPECT_NE(no_name.err.find("it is not on PATH: give its path, such as ./tandem-no-such-program"),
            std::string::npos)
      << no_name.err;

  auto bad_node = run_process(launch({"--nnodes", "2", "--node-rank", "2", "/bin/true"}), 10);
  EXPECT_EQ(bad_node.exit_code, 2);
  EXPECT_NE(bad_node.err.find("--node-rank 2"), std::string::npos) << bad_node.err;
  // accelerate's spelling is named as given.
  auto bad_machine = run_process(
      launch({"--num_machines", "2", "--machine_rank", "5", "--master-port", "0", "/bin/true"}),
      10);
  EXPECT_EQ(bad_machine.exit_code, 2);
  EXPECT_NE(bad_machine.err.find("--machine_rank 5 must be in [0, --nnodes=2)"),
            std::string::npos)
      << bad_machine.err;

  auto bad_flag = run_process(launch({"--nproc-per-node", "two", "/bin/true"}), 10);
  EXPECT_EQ(bad_flag.exit_code, 2);
}

TEST(Launch, IncludeFilterSetsVisibleDevicesAndProcessCount) {
  auto r = run_process(launch({"--include", "localhost:1,3", "--no-prefix", "/bin/sh", "-c",
                               "echo $LOCAL_RANK:$WORLD_SIZE:$CUDA_VISIBLE_DEVICES"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0:2:1,3\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1:2:1,3\n"), std::string::npos) << r.out;

  auto ex = run_process(launch({"--nproc-per-node", "3", "--exclude", "localhost:1", "--no-prefix",
                                "/bin/sh", "-c", "echo $LOCAL_RANK:$CUDA_VISIBLE_DEVICES"}),
                        30);
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  EXPECT_NE(ex.out.find("1:0,2\n"), std::string::npos) << ex.out;
}

TEST(Launch, LogDirKeepsEachRanksStreams) {
  TempDir logs;
  auto r = run_process(launch({"--nproc-per-node", "2", "--log-dir", logs.path(), "/bin/sh", "-c",
                               "echo out$RANK; echo err$RANK >&2"}),
                       30);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(logs.path() + "/attempt_0/rank_1/stdout.log"), "out1\n");
  EXPECT_EQ(read_file(logs.path() + "/attempt_0/rank_1/stderr.log"), "err1\n");
  EXPECT_NE(r.out.find("[rank0]: out0"), std::string::npos) << "--log-dir alone also tees";

  TempDir quiet;
  auto q = run_process(launch({"--nproc-per-node", "1", "--log-dir", quiet.path(), "--redirects",
                               "3", "/bin/sh", "-c", "echo hidden"}),
                       30);
  EXPECT_EQ(q.out.find("hidden"), std::string::npos);
  EXPECT_EQ(read_file(quiet.path() + "/attempt_0/rank_0/stdout.log"), "hidden\n");
}

// Socket inodes held open by `pid`.
std::set<std::string> socket_inodes(pid_t pid) {
  std::set<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return inodes;
  while (dirent* e = ::readdir(d)) {
    char target[256] = {0};
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    std::string link(target, n > 0 ? static_cast<size_t>(n) : 0);
    if (link.rfind("socket:[", 0) == 0) inodes.insert(link.substr(8, link.size() - 9));
  }
  ::closedir(d);
  return inodes;
}

// An IPv4 address of this machine that is not loopback; "" if there is none.
std::string external_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// Issue 8's acceptance: a single-node job (launcher and workers, after the
// rendezvous and a collective) listens on loopback only, even when
// --master-addr names an external address.
TEST(Launch, SingleNodeJobListensOnLoopbackOnly) {
  std::vector<std::vector<std::string>> extra = {{}};
  const std::string external = external_ipv4();
  if (!external.empty()) extra.push_back({"--master-addr", external});
  for (const auto& flags : extra) {
    TempDir pid_dir;
    std::vector<std::string> args = {"--nproc-per-node", "2", "--master-port", "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {bin("launch_test_worker"), "allreduce-then-hang"});
    BackgroundProcess job(launch(args), {"TANDEM_TEST_PID_DIR=" + pid_dir.path()});
    auto pids = wait_for_pids(pid_dir.path(), 2, 60);
    ASSERT_EQ(pids.size(), 2u) << "the workers did not get through their all-reduce";
    std::set<std::string> inodes = socket_inodes(job.pid());
    for (pid_t p : pids) {
      auto more = socket_inodes(p);
      inodes.insert(more.begin(), more.end());
    }
    int listening = 0;
    for (const auto& listener : testing::tcp_listeners()) {
      if (!inodes.count(listener.inode)) continue;
      ++listening;
      EXPECT_TRUE(testing::is_loopback_listener(listener))
          << "a socket of the job listens on " << listener.local << " (/proc/net/tcp notation)";
    }
    EXPECT_GT(listening, 0) << "found no listening socket at all: the check is broken";
    job.send(SIGTERM);
    job.wait(20);
    EXPECT_TRUE(none_alive(pids, 5.0));
  }
}

}  // namespace
}  // namespace tandem
