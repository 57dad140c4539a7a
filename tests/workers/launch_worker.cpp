// A worker program for the launcher tests. Usage: launch_test_worker MODE [ARGS]
//   allreduce           join the group, all-reduce rank+1, check the sum (and
//                       print TORCHELASTIC_MAX_RESTARTS)
//   exit CODE RANK      rank RANK exits with CODE after joining; others hang
//   hang                join the group, then hang until killed
//   exit-on-first-attempt CODE RANK   restart 0 (TANDEM_RESTART_COUNT): rank RANK
//                       exits with CODE, the others hang; later restarts: allreduce
//   loop-on-first-attempt  restart 0: allreduce-loop; later restarts: allreduce
//   loop-until-restart N   restarts below N: allreduce-loop; from N on: allreduce
//   allreduce-loop      join, all-reduce and barrier, write the pid file, then
//                       all-reduce every 50 ms until stopped or a collective fails
//   allreduce-then-hang join, all-reduce and barrier, then write the pid file
//                       (so it marks a rank past its first collective) and hang
//   hang-nojoin         hang without joining (no rendezvous needed)
//   exit-in-loop CODE RANK  as allreduce-loop, but rank RANK exits with CODE
//                       (_exit) after 5 all-reduces, leaving a child that ignores
//                       SIGTERM for 1 s (its launcher takes that long to stop);
//                       the others record the CommError that follows (error
//                       file) and exit 1
//   config              resolve the config as a program would (TANDEM_CONFIG_FILE,
//                       TANDEM_MIXED_PRECISION, ...) and print it; no rendezvous
// With TANDEM_TEST_PID_DIR set, each rank writes its pid to DIR/rank<R>.pid
// first (allreduce-then-hang: after its collective), so tests can check that
// no worker survives.

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "tandem/tandem.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace launch_test_worker {

namespace {

[[noreturn]] void hang() {
  for (;;) ::pause();  // until a signal kills us
}

void write_pid(const tandem::RankEnv& env) {
  const char* dir = std::getenv("TANDEM_TEST_PID_DIR");
  if (dir == nullptr) return;
  std::ofstream(std::string(dir) + "/rank" + std::to_string(env.rank) + ".pid") << ::getpid();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: launch_test_worker MODE [ARGS]\n");
    return 2;
  }
  std::string mode = argv[1];
  try {
    auto env = tandem::RankEnv::from_environment();
    if (mode == "loop-on-first-attempt") {
      // Restart 0: as allreduce-loop; later: argv[2] (default allreduce).
      mode = env.restart_count == 0 ? "allreduce-loop" : argc >= 3 ? argv[2] : "allreduce";
    }
    if (mode == "loop-until-restart" && argc >= 3) {
      // Restarts below argv[2]: as allreduce-loop; from it on: an all-reduce.
      mode = env.restart_count < std::atoi(argv[2]) ? "allreduce-loop" : "allreduce";
    }
    if (mode != "allreduce-then-hang" && mode != "allreduce-loop") {
      write_pid(env);
    }
    if (mode == "hang-nojoin") hang();
    if (mode == "config") {
      auto config_env = tandem::ConfigEnv::from_environment();
      tandem::Config file;
      if (!config_env.config_file.empty()) file = tandem::load_config_file(config_env.config_file);
      auto config = tandem::resolve_config(file, config_env, {}, env.world_size);
      std::printf("rank %d/%d mixed_precision=%s file=%s accumulation=%lld\n", env.rank,
                  env.world_size, tandem::to_string(config.mixed_precision),
                  config_env.config_file.c_str(),
                  static_cast<long long>(config.gradient_accumulation_steps.value_or(1)));
      return 0;
    }
    if (mode == "cpus") {
      // The worker's CPU affinity, as the kernel reports it.
      std::ifstream status("/proc/self/status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("Cpus_allowed_list:", 0) == 0) {
          std::printf("rank %d %s\n", env.local_rank, line.c_str());
        }
      }
      return 0;
    }
    auto pg = tandem::ProcessGroup::init(env);
    if (mode == "desync-after" && argc >= 3) {
      // argv[2] matching all-reduces, then one whose op differs by rank.
      auto t = at::ones({6});
      for (int i = 0; i < std::atoi(argv[2]); ++i) pg->all_reduce(t);
      pg->all_reduce(t, pg->rank() == 0 ? tandem::ReduceOp::kSum : tandem::ReduceOp::kMax);
      std::printf("rank %d: no desync caught\n", pg->rank());
      return 0;
    }
    if (mode == "exit-on-first-attempt" && argc >= 4) {
      // Restart 0: rank argv[3] exits with argv[2]; later: an all-reduce.
      if (env.restart_count == 0 && pg->rank() == std::atoi(argv[3])) return std::atoi(argv[2]);
      if (env.restart_count == 0) hang();
      mode = "allreduce";
    }
    if (mode == "allreduce") {
      auto t = at::full({1000}, static_cast<float>(pg->rank() + 1));
      pg->all_reduce(t);
      const float want = pg->world_size() * (pg->world_size() + 1) / 2.0f;
      const bool ok = t.eq(want).all().item<bool>();
      const char* max_restarts = std::getenv("TORCHELASTIC_MAX_RESTARTS");
      std::printf("rank %d/%d allreduce %s sum=%g source=%s local=%d/%d threads=%d "
                  "max_restarts=%s\n",
                  pg->rank(), pg->world_size(), ok ? "ok" : "WRONG", t[0].item<float>(),
                  tandem::to_string(env.source), env.local_rank, env.local_world_size,
                  at::get_num_threads(), max_restarts != nullptr ? max_restarts : "-");
      pg->barrier();
      return ok ? 0 : 1;
    }
    if (mode == "exit" && argc >= 4) {
      if (pg->rank() == std::atoi(argv[3])) return std::atoi(argv[2]);
      hang();
    }
    if (mode == "hang") hang();
    if (mode == "allreduce-loop") {
      // Training-like: collectives every 50 ms until stopped, or until one
      // fails (a peer gone: TANDEM_TIMEOUT_S bounds the wait).
      auto t = at::ones({16});
      pg->all_reduce(t);
      pg->barrier();
      write_pid(env);
      for (;;) {
        pg->all_reduce(t);
        ::usleep(50 * 1000);
      }
    }
    if (mode == "exit-in-loop" && argc >= 4) {
      auto t = at::ones({16});
      pg->all_reduce(t);
      pg->barrier();
      write_pid(env);
      try {
        for (int i = 0;; ++i) {
          if (i == 5 && pg->rank() == std::atoi(argv[3])) {
            if (::fork() == 0) {
              // Only stdio: the peers must see this rank's connections close.
              ::close_range(3, ~0U, 0);
              std::signal(SIGTERM, SIG_IGN);
              ::sleep(1);
              ::_exit(0);
            }
            // At once, as a crash would: a return would first close the
            // group, and its peers on this host could fail (CommError) and
            // be the first failure its launcher sees.
            std::fflush(nullptr);
            ::_exit(std::atoi(argv[2]));
          }
          pg->all_reduce(t);
          ::usleep(50 * 1000);
        }
      } catch (const tandem::CommError& e) {
        tandem::record_error(e);
        std::fprintf(stderr, "launch_test_worker: %s\n", e.what());
        return 1;
      }
    }
    if (mode == "allreduce-then-hang") {
      auto t = at::ones({16});
      pg->all_reduce(t);
      pg->barrier();
      write_pid(env);
      hang();
    }
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_test_worker: %s\n", e.what());
    return 1;
  }
}

}  // namespace launch_test_worker
