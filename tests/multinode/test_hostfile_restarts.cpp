// `tandem launch --hostfile` restarts: the head restarts every host together,
// on the hosts that answer, down to --nnodes MIN, and --keep-global-batch
// (host_fanout.h).

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "multinode/hostfile_cluster.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::expect_all_reduced;
using testing::max_relative_diff;
using testing::SshCluster;
using testing::wait_for_ranks;

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
  EXPECT_NE(r.err.find("restarting the job after a failure (1 of --max-restarts 1)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("3 host(s) from " + c.hostfile + ", 6 process(es), store on " +
                       c.cluster.address(0) + ":29673 (restart 1)"),
            std::string::npos)
      << r.err;
  expect_all_reduced(r.out, 6);
  // Every host's workers see the job's budget, as under torchrun, though
  // the head, not their launcher, spends it.
  EXPECT_EQ(r.out.find("max_restarts=0"), std::string::npos) << r.out;
  size_t seen = 0;
  for (size_t at = r.out.find("max_restarts=1"); at != std::string::npos;
       at = r.out.find("max_restarts=1", at + 1)) {
    ++seen;
  }
  EXPECT_EQ(seen, 6u) << r.out;
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, ALostHostIsLeftOutWhileAtLeastMinHostsAnswer) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.pid_dir();
  BackgroundProcess head(c.head(29675, {"--nnodes", "2:3", "--max-restarts", "1",
                                        bin("launch_test_worker"), "loop-on-first-attempt"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(wait_for_ranks(pids, 6));
  ASSERT_TRUE(c.cluster.kill_host(2));
  auto r = head.wait(120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + c.cluster.address(2) + " does not answer ssh; leaving it out"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("2 host(s) from " + c.hostfile + ", 4 process(es)"), std::string::npos)
      << r.err;
  expect_all_reduced(r.out, 4);
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, LosingAHostResumesFromTheLastCheckpointOnTheOthers) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.pid_dir(), ckpt = c.dir.path() + "/ckpt";
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
  ASSERT_TRUE(wait_for_ranks(pids, 6));
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

// Issue 31's fault 5.6: kill one host, go on with two, let it come back and
// finish on three, with no failure to restart the job for it.
TEST(HostfileRestarts, AHostThatComesBackRejoinsWithoutAFailure) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.pid_dir(), ckpt = c.dir.path() + "/ckpt";
  const std::string one = c.dir.path() + "/one.safetensors";
  const std::string rejoined = c.dir.path() + "/rejoined.safetensors";
  auto alone = testing::run_process({bin("quickstart_worker"), "40", "48", one}, 120);
  ASSERT_EQ(alone.exit_code, 0) << alone.out << alone.err;
  // 6 ranks save every 10 steps and stop after step 20's checkpoint; host 2
  // dies; 4 ranks resume from it and stop after step 30's; host 2 answers
  // again; the head restarts the job and 6 ranks resume from step 30.
  BackgroundProcess head(
      c.head(29681, {"--nnodes", "2:3", "--max-restarts", "1", "--monitor-interval", "1",
                     bin("quickstart_worker"), "40", "48", rejoined, ckpt, "10"}),
      {"TANDEM_TEST_PID_DIR=" + pids, "TANDEM_TEST_HANG_AFTER_STEP=20",
       "TANDEM_TEST_HANG_ON_RANKS=4:30"});
  ASSERT_TRUE(wait_for_ranks(pids, 6));
  ASSERT_EQ(std::system(("rm -f " + pids + "/*").c_str()), 0);
  ASSERT_TRUE(c.cluster.kill_host(2));
  ASSERT_TRUE(wait_for_ranks(pids, 4)) << "the job did not go on without host 2";
  ASSERT_EQ(c.cluster.restart_ssh(2), "");
  auto r = head.wait(180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string host2 = c.cluster.address(2);
  const std::string store = ", store on " + c.cluster.address(0) + ":29681";
  EXPECT_NE(r.err.find("2 host(s) from " + c.hostfile + ", 4 process(es)" + store +
                       " (restart 1)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("tandem launch: host " + host2 + " answers again; restarting the job "
                       "to take it in (a membership change, not counted against "
                       "--max-restarts)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("3 host(s) from " + c.hostfile + ", 6 process(es)" + store +
                       " (restart 2)"),
            std::string::npos)
      << r.err;
  const size_t failure = r.err.find(") failed with exit code");
  EXPECT_NE(failure, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(") failed with exit code", failure + 1), std::string::npos)
      << "host 2's loss is the job's only failure\n" << r.err;
  const std::string rank0 = "[" + c.cluster.address(0) + ":rank0]: ";
  EXPECT_NE(r.out.find(rank0 + "resumed at step 20 on 4 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(rank0 + "resumed at step 30 on 6 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(rank0 + "{\"world\": 6, \"steps\": 40"), std::string::npos) << r.out;
  const double diff = max_relative_diff(rejoined, one);
  EXPECT_LE(diff, 1e-5) << "6 ranks, then 4, then 6 again, against one process";
  std::printf("host rejoined, finished on 6 ranks: largest relative difference %.3g\n", diff);
  EXPECT_TRUE(c.leftovers().empty());
}

TEST(HostfileRestarts, KeepGlobalBatchScalesAccumulationToTheRanksLeft) {
  SshCluster c(2);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.pid_dir();
  // 4 ranks x 3 accumulation steps; after host 1 is lost, 2 ranks x 6.
  BackgroundProcess head(c.head(29683, {"--nnodes", "1:2", "--max-restarts", "1",
                                        "--keep-global-batch", bin("launch_test_worker"),
                                        "loop-on-first-attempt", "config"}),
                         {"TANDEM_TEST_PID_DIR=" + pids, "TANDEM_GRADIENT_ACCUMULATION_STEPS=3"});
  ASSERT_TRUE(wait_for_ranks(pids, 4));
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
  const std::string pids = c.pid_dir();
  BackgroundProcess head(c.head(29685, {"--nnodes", "2:3", "--max-restarts", "1",
                                        "--keep-global-batch", bin("launch_test_worker"),
                                        "loop-on-first-attempt"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(wait_for_ranks(pids, 6));
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
  expect_all_reduced(r.out, 4);
  EXPECT_NE(r.out.find("[" + c.cluster.address(2) + ":rank3]: "), std::string::npos) << r.out;
}

TEST(HostfileRestarts, FewerHostsThanMinEndTheJob) {
  SshCluster c(3);
  if (!c.why.empty()) GTEST_SKIP() << "skipped: " << c.why;
  const std::string pids = c.pid_dir();
  BackgroundProcess head(c.head(29677, {"--nnodes", "3:3", "--max-restarts", "2",
                                        bin("launch_test_worker"), "loop-on-first-attempt"}),
                         {"TANDEM_TEST_PID_DIR=" + pids});
  ASSERT_TRUE(wait_for_ranks(pids, 6));
  ASSERT_TRUE(c.cluster.kill_host(1));
  auto r = head.wait(120);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("2 of 3 hosts answer, fewer than the 3 --nnodes asks for; giving up"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(c.leftovers().empty());
}

}  // namespace
}  // namespace tandem
