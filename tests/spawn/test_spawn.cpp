// tandem::spawn with real worker processes: this test binary forks itself.
// Workers tell the test what they saw through files in a scratch directory;
// a worker that must wait for a sibling waits on those files (inotify), never
// on a sleep.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/scoped_env.h"
#include "support/scratch_dir.h"
#include "support/subprocess.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/spawn.h"
#include "tandem/core/rank_env.h"

namespace tandem {
namespace {

using testing::process_alive;
using testing::read_file;
using testing::ScopedEnv;
using testing::ScratchDir;
using testing::wait_for_exit;
using testing::wait_for_files;

const char* const kRankVariables[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR", "MASTER_PORT", "TANDEM_ERROR_FILE",
                                      "TORCHELASTIC_USE_AGENT_STORE", "TANDEM_STORE_TOKEN"};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::rename((path + ".tmp").c_str(), path.c_str());  // readers see whole files only
}

void write_pid(const ScratchDir& dir, const std::string& name) {
  write_text(dir / name, std::to_string(::getpid()));
}

// Waits (inotify) until every named file exists in dir, up to 60 s.
void await_files(const ScratchDir& dir, const std::vector<std::string>& names) {
  wait_for_files(
      dir.path(),
      [&] {
        for (const auto& name : names) {
          if (!std::ifstream(dir / name)) return false;
        }
        return true;
      },
      60);
}

[[noreturn]] void hang() {
  for (;;) ::pause();
}

pid_t read_pid(const ScratchDir& dir, const std::string& name) {
  return static_cast<pid_t>(std::atoi(read_file(dir / name).c_str()));
}

// Every recorded process is gone (not even a zombie) within `seconds`.
void expect_gone(const ScratchDir& dir, const std::vector<std::string>& pid_files) {
  for (const auto& name : pid_files) {
    const pid_t pid = read_pid(dir, name);
    ASSERT_GT(pid, 0) << name;
    EXPECT_TRUE(wait_for_exit(pid, 10)) << name << " (pid " << pid << ") is still running";
  }
}

class SpawnByWorld : public ::testing::TestWithParam<int> {};

TEST_P(SpawnByWorld, EveryRankRunsWithTheRankEnvironmentAndJoinsTheJob) {
  const int world = GetParam();
  ScratchDir dir;
  ScopedEnv env;  // a program no launcher started
  for (const char* name : kRankVariables) env.set(name, nullptr);
  spawn(
      [&](int rank) {
        const RankEnv rank_env = RankEnv::from_environment();
        auto group = ProcessGroup::init(rank_env);
        at::Tensor sum = at::full({1}, rank + 1, at::kLong);
        group->all_reduce(sum);
        nlohmann::json seen = {{"rank", rank_env.rank},
                               {"world", rank_env.world_size},
                               {"local_rank", rank_env.local_rank},
                               {"local_world", rank_env.local_world_size},
                               {"master_addr", rank_env.master_addr},
                               {"group_world", group->world_size()},
                               {"sum", sum.item<int64_t>()},
                               {"pid", ::getpid()}};
        write_text(dir / ("rank_" + std::to_string(rank)), seen.dump());
      },
      world);
  for (int rank = 0; rank < world; ++rank) {
    auto seen = nlohmann::json::parse(read_file(dir / ("rank_" + std::to_string(rank))));
    EXPECT_EQ(seen["rank"], rank);
    EXPECT_EQ(seen["world"], world);
    EXPECT_EQ(seen["local_rank"], rank);
    EXPECT_EQ(seen["local_world"], world);
    EXPECT_EQ(seen["master_addr"], "127.0.0.1");
    EXPECT_EQ(seen["group_world"], world);
    EXPECT_EQ(seen["sum"], world * (world + 1) / 2);
    EXPECT_NE(seen["pid"], ::getpid()) << "fn must run in a worker process";
    EXPECT_FALSE(process_alive(seen["pid"].get<pid_t>())) << "rank " << rank << " was not reaped";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, SpawnByWorld, ::testing::Values(1, 2, 3));

TEST(Spawn, AnOuterLaunchersRankVariablesAreReplaced) {
  ScratchDir dir;
  ScopedEnv env;
  env.set("RANK", "5");
  env.set("WORLD_SIZE", "9");
  env.set("LOCAL_RANK", "5");
  env.set("MASTER_PORT", "1");
  env.set("TANDEM_ERROR_FILE", "/nonexistent/error.json");
  SpawnOptions options;
  options.nprocs = 2;
  options.env = {{"TANDEM_SPAWN_TEST_EXTRA", "yes"}};
  spawn(
      [&](int rank) {
        const RankEnv rank_env = RankEnv::from_environment();
        const char* extra = std::getenv("TANDEM_SPAWN_TEST_EXTRA");
        write_text(dir / ("rank_" + std::to_string(rank)),
                   fmt::format("{} {} {} {}", rank_env.rank, rank_env.world_size,
                               rank_env.error_file.rfind("/nonexistent", 0) == 0,
                               extra ? extra : "unset"));
      },
      options);
  EXPECT_EQ(read_file(dir / "rank_0"), "0 2 false yes");
  EXPECT_EQ(read_file(dir / "rank_1"), "1 2 false yes");
  EXPECT_STREQ(std::getenv("RANK"), "5") << "the caller's environment must stay as it was";
}

TEST(Spawn, TheFirstFailureNamesItsRankAndEveryOtherProcessIsStopped) {
  ScratchDir dir;
  try {
    spawn(
        [&](int rank) {
          if (rank == 1) {
            await_files(dir, {"pid_0", "pid_2", "pid_grandchild"});
            throw std::runtime_error("rank one gave up");
          }
          if (rank == 0 && ::fork() == 0) {  // a process of the worker's own
            write_pid(dir, "pid_grandchild");
            hang();
          }
          write_pid(dir, "pid_" + std::to_string(rank));
          hang();
        },
        3);
    FAIL() << "spawn returned although rank 1 threw";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_EQ(e.worker_message(), "std::runtime_error: rank one gave up");
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 of 3 failed: std::runtime_error: rank one gave up"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("rank(s) 0, 2 were stopped"), std::string::npos) << what;
  }
  expect_gone(dir, {"pid_0", "pid_2", "pid_grandchild"});
}

TEST(Spawn, AWorkerThatIgnoresSigtermIsKilledAfterTheGracePeriod) {
  ScratchDir dir;
  SpawnOptions options;
  options.nprocs = 2;
  options.grace_period = std::chrono::milliseconds(200);
  EXPECT_THROW(spawn(
                   [&](int rank) {
                     if (rank == 1) {
                       await_files(dir, {"pid_0"});
                       throw std::runtime_error("stop");
                     }
                     ::signal(SIGTERM, SIG_IGN);
                     write_pid(dir, "pid_0");
                     hang();
                   },
                   options),
               SpawnError);
  expect_gone(dir, {"pid_0"});
}

TEST(Spawn, ACommErrorIsTheCauseOnlyWhenNothingElseFailed) {
  ScratchDir dir;
  try {
    spawn(
        [&](int rank) {
          // Both report, whichever failure the parent sees first.
          ::signal(SIGTERM, SIG_IGN);
          if (rank == 0) {
            await_files(dir, {"ready_1"});
            write_pid(dir, "comm_error");
            throw CommError("a peer went away");
          }
          write_pid(dir, "ready_1");
          await_files(dir, {"comm_error"});
          throw UsageError("the real cause");
        },
        2);
    FAIL() << "spawn returned although both ranks threw";
  } catch (const SpawnError& e) {
    EXPECT_EQ(e.rank(), 1) << e.what();
    EXPECT_EQ(e.worker_message(), "tandem::UsageError: the real cause");
    EXPECT_NE(std::string(e.what()).find("rank(s) 0 failed as well"), std::string::npos)
        << e.what();
  }
}

TEST(Spawn, ExitingOrCrashingInsideFnIsAFailureThatSaysHow) {
  auto failure_of = [](const std::function<void(int)>& fn) -> std::string {
    try {
      spawn(fn, 2);
    } catch (const SpawnError& e) {
      EXPECT_EQ(e.rank(), 1) << e.what();
      return e.worker_message();
    }
    return "no failure";
  };
  EXPECT_NE(failure_of([](int rank) {
              if (rank == 1) std::_Exit(3);
            }).find("exited with code 3 before the function returned"),
            std::string::npos);
  EXPECT_NE(failure_of([](int rank) {
              if (rank == 1) std::_Exit(0);
            }).find("exited with code 0 before the function returned"),
            std::string::npos);
  EXPECT_NE(failure_of([](int rank) {
              if (rank == 1) ::raise(SIGKILL);
            }).find("killed by signal SIGKILL"),
            std::string::npos);
  // An exception nobody catches, in a thread of the worker: the terminate
  // handler's error file still names it.
  const std::string uncaught = failure_of([](int rank) {
    if (rank != 1) return;
    rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    std::thread([] { throw std::logic_error("thrown in a helper thread"); }).join();
  });
  EXPECT_NE(uncaught.find("std::logic_error: thrown in a helper thread (uncaught; the process "
                          "was killed by signal SIGABRT"),
            std::string::npos)
      << uncaught;
}

TEST(Spawn, PastTheTimeoutEveryWorkerIsStoppedAndTheErrorNamesThem) {
  ScratchDir dir;
  SpawnOptions options;
  options.nprocs = 2;
  options.timeout = std::chrono::milliseconds(500);
  try {
    spawn(
        [&](int rank) {
          write_pid(dir, "pid_" + std::to_string(rank));
          hang();
        },
        options);
    FAIL() << "spawn returned although no worker finished";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 0, 1 were still running"), std::string::npos)
        << e.what();
  }
  // A worker the timeout caught before it wrote its pid is gone with spawn().
  for (const char* name : {"pid_0", "pid_1"}) {
    if (std::ifstream(dir / name)) expect_gone(dir, {name});
  }
}

// A worker killed while its shared-memory segment still has a name (before
// its peers mapped it) leaves no /dev/shm entry behind: spawn removes the
// names a reaped worker created, as `tandem launch` does. The workers here
// make a file under that naming, tandem-<pid>-*, and are killed by the
// timeout; a worker that ends on its own has its names removed too.
TEST(Spawn, SharedMemoryNamesOfReapedWorkersGoWithThem) {
  ScratchDir dir;
  SpawnOptions options;
  options.nprocs = 2;
  options.timeout = std::chrono::milliseconds(1500);
  auto make_segment_name = [] {
    const std::string path = "/dev/shm/tandem-" + std::to_string(::getpid()) + "-spawntest";
    std::ofstream(path) << "x";
    return path;
  };
  try {
    spawn(
        [&](int rank) {
          write_text(dir / ("segment_" + std::to_string(rank)), make_segment_name());
          if (rank == 1) hang();
        },
        options);
    FAIL() << "spawn returned although rank 1 hung";
  } catch (const TimeoutError&) {
  }
  int checked = 0;
  for (const char* name : {"segment_0", "segment_1"}) {
    if (!std::ifstream(dir / name)) continue;  // the timeout came first
    const std::string segment = read_file(dir / name);
    EXPECT_FALSE(std::ifstream(segment).good()) << segment << " outlived its worker";
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no worker made its segment within the timeout";
}

TEST(Spawn, RefusesToForkWhileAProcessGroupIsAlive) {
  testing::run_ranks(2, [](ProcessGroup&) {
    try {
      spawn([](int) {}, 1);
      ADD_FAILURE() << "spawn forked next to a live ProcessGroup";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("inside the function you pass to spawn()"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_NO_THROW(spawn([](int) {}, 1)) << "the groups are gone: spawn may fork again";
}

TEST(Spawn, BadOptionsAreUsageErrors) {
  auto noop = [](int) {};
  EXPECT_THROW(spawn(noop, 0), UsageError);
  EXPECT_THROW(spawn(noop, -2), UsageError);
  EXPECT_THROW(spawn(std::function<void(int)>(), 1), UsageError);
  SpawnOptions options;
  options.master_port = 70000;
  EXPECT_THROW(spawn(noop, options), UsageError);
  options.master_port = 0;
  options.env = {{"MASTER_PORT", "1234"}};
  EXPECT_THROW(spawn(noop, options), UsageError);
}

TEST(Spawn, AFunctionWithoutARankReadsItFromTheEnvironment) {
  ScratchDir dir;
  spawn(
      [&] {
        const RankEnv rank_env = RankEnv::from_environment();
        write_text(dir / ("rank_" + std::to_string(rank_env.rank)), "ran");
      },
      2);
  EXPECT_EQ(read_file(dir / "rank_0"), "ran");
  EXPECT_EQ(read_file(dir / "rank_1"), "ran");
}

TEST(Spawn, WorksAfterTheCallerRanAParallelOperation) {
  // LibTorch's OpenMP pool now exists in this process; the workers have none.
  at::set_num_threads(2);
  const at::Tensor x = at::arange(1 << 22, at::kDouble);
  const double want = x.sin().sum().item<double>();
  ScratchDir dir;
  spawn(
      [&](int rank) {
        const double got = x.sin().sum().item<double>();  // a parallel loop again
        // Another thread count sums in another order: equal to rounding.
        const bool close = std::abs(got - want) <= 1e-9 * std::abs(want) + 1e-9;
        write_text(dir / ("rank_" + std::to_string(rank)),
                   fmt::format("{} {}", close, at::get_num_threads()));
      },
      2);
  EXPECT_EQ(read_file(dir / "rank_0"), "true 1");
  EXPECT_EQ(read_file(dir / "rank_1"), "true 1");
}

// ---- the caller dies ----------------------------------------------------------

// Run by KilledCallerTakesItsWorkersWithIt as a separate process.
TEST(SpawnHelper, DISABLED_CallerThatWillBeKilled) {
  const char* dir = std::getenv("TANDEM_SPAWN_TEST_DIR");
  if (dir == nullptr) GTEST_SKIP() << "run by Spawn.KilledCallerTakesItsWorkersWithIt";
  spawn(
      [&](int rank) {
        write_text(std::string(dir) + "/pid_" + std::to_string(rank), std::to_string(::getpid()));
        hang();
      },
      2);
}

TEST(Spawn, KilledCallerTakesItsWorkersWithIt) {
  ScratchDir dir;
  char self[4096] = {0};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  testing::BackgroundProcess caller(
      {self, "--gtest_filter=SpawnHelper.DISABLED_CallerThatWillBeKilled",
       "--gtest_also_run_disabled_tests"},
      {"TANDEM_SPAWN_TEST_DIR=" + dir.path()});
  await_files(dir, {"pid_0", "pid_1"});
  ASSERT_TRUE(std::ifstream(dir / "pid_1")) << "the workers never started";
  caller.send(SIGKILL);
  caller.wait(30);
  expect_gone(dir, {"pid_0", "pid_1"});
}

}  // namespace
}  // namespace tandem
