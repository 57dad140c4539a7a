// Which worker a failure report names as the root cause (failure_report.h).

#include <csignal>

#include <gtest/gtest.h>

#include "launch/failure_report.h"
#include "support/scratch_dir.h"

namespace tandem::cli {
namespace {

WorkerExit exited(int rank, int code, int signal, double wall_time) {
  WorkerExit exit;
  exit.global_rank = rank;
  exit.pid = 1000 + rank;
  exit.exit_code = code;
  exit.signal = signal;
  exit.wall_time = wall_time;
  return exit;
}

TEST(FailureReport, AWorkerKilledBySigpipeIsAConsequenceNotTheCause) {
  // Rank 0 wrote to the connection of rank 2, which had crashed: it died
  // of SIGPIPE first, with no error file.
  testing::ScratchDir dir;
  GroupResult result;
  result.exits = {exited(0, 0, SIGPIPE, 100.0), exited(2, 7, 0, 100.1)};
  const FailureReport report = make_failure_report(result, dir.path());
  EXPECT_EQ(report.root_cause.exit.global_rank, 2);
  EXPECT_TRUE(is_consequence(report.others.at(0)));
  EXPECT_FALSE(is_consequence(report.root_cause));
  // Alone, it is all there is to name.
  result.exits = {exited(0, 0, SIGPIPE, 100.0)};
  EXPECT_EQ(make_failure_report(result, dir.path()).root_cause.exit.global_rank, 0);
}

}  // namespace
}  // namespace tandem::cli
