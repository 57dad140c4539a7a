// Checkpoint faults with real processes: a save killed at random moments
// always leaves a loadable previous checkpoint, and a full disk gives a
// clear error with nothing committed.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <random>

#include "support/subprocess.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::run_process;
using testing::TempDir;

// When `path` was last modified (0 if missing), in nanoseconds.
int64_t modified_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

TEST(CheckpointFaults, KillDuringSaveAtTwentyRandomPointsLeavesALoadableCheckpoint) {
  TempDir dir;
  const std::string latest = dir.path() + "/latest";
  std::mt19937 rng(20261123);
  // Saves run back to back (a 4 MiB state each). After the saver's first
  // commit, it is killed at the k-th wake-up on file events in DIR (random
  // k): creating .tmp-<tag>, writing .latest.tmp, renaming the tag or
  // `latest` into place, pruning. So kills land in every phase of a save.
  std::uniform_int_distribution<int> events_before_kill(0, 12);
  int last_step = 0;
  for (int round = 0; round < 20; ++round) {
    {
      const int64_t before = modified_ns(latest);
      BackgroundProcess saver({bin("checkpoint_worker"), "save-loop", dir.path()});
      const int k = events_before_kill(rng);
      int seen = 0;
      const bool reached = testing::wait_for_files(
          dir.path(),
          [&] { return modified_ns(latest) != before && seen++ >= k; }, 60);
      ASSERT_TRUE(reached) << "the saver never committed";
      saver.send(SIGKILL);
      const auto killed = saver.wait(10);
      ASSERT_EQ(killed.signal, SIGKILL) << killed.err;
    }
    const auto verify = run_process({bin("checkpoint_worker"), "verify", dir.path()}, 60);
    ASSERT_EQ(verify.exit_code, 0) << "round " << round << ": " << verify.out << verify.err;
    const int step = std::stoi(verify.out.substr(3));
    EXPECT_GE(step, 1);
    last_step = step;
  }
  EXPECT_GT(last_step, 0);
}

TEST(CheckpointFaults, DiskFullDuringSaveFailsClearlyAndCommitsNothing) {
  TempDir dir;
  const std::string mount = dir.path() + "/small";
  ASSERT_EQ(::mkdir(mount.c_str(), 0755), 0);
  // A 100 KiB tmpfs in a private mount namespace: the first save (~70 KiB)
  // fits, the second does not while the first is kept.
  const std::string script = "mount -t tmpfs -o size=100k none '" + mount + "' && exec '" +
                             bin("checkpoint_worker") + "' disk-full '" + mount + "/ckpt'";
  const auto probe = run_process({"unshare", "-rm", "true"}, 10);
  if (probe.exit_code != 0) GTEST_SKIP() << "no user namespaces here: " << probe.err;
  const auto r = run_process({"unshare", "-rm", "sh", "-c", script}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nothing was committed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("previous checkpoint intact"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tandem
