// Accelerate launch keys that change the workers: `debug: true` makes
// every collective's fingerprint checked (TANDEM_DEBUG=DETAIL), and
// `enable_cpu_affinity: true` pins each local worker to its own CPUs.

#include <gtest/gtest.h>

#include <sched.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "launch/config_cli_helpers.h"

namespace tandem {
namespace {

using testing::bin;
using testing::run_process;
using testing::tandem_in;
using testing::TempDir;
using testing::write_text;

std::string keys_cpu_config(int processes, const std::string& extra) {
  return "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: " +
         std::to_string(processes) + "\nnum_machines: 1\nmachine_rank: 0\nuse_cpu: true\n" +
         extra;
}

// `tandem launch` of launch_test_worker ARGS with `config`, without the
// debug variables of the environment the test runs in.
testing::ProcessResult keys_launch_with(const std::string& config,
                                   const std::vector<std::string>& worker_args,
                                   const std::vector<std::string>& env_settings = {}) {
  TempDir home;
  const std::string path = home.path() + "/accelerate.yaml";
  write_text(path, config);
  std::vector<std::string> args = {"launch", "--master-port", "0", "--config-file", path,
                                   "--no-prefix", bin("launch_test_worker")};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  std::vector<std::string> argv = {"env", "-u", "TANDEM_DEBUG", "-u", "TORCH_DISTRIBUTED_DEBUG"};
  argv.insert(argv.end(), env_settings.begin(), env_settings.end());
  for (const auto& a : tandem_in(home.path(), args)) argv.push_back(a);
  return run_process(argv, 120);
}

int keys_count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A desync after the first 256 collectives, which the default check no
// longer covers: over Gloo (TANDEM_SHM=0) only the config's debug key
// catches it. The shared-memory transport compares every call's reduce op
// itself, so there the plain run stops too.
TEST(LaunchTrainingKeys, DebugCatchesADesyncAfterTheFirst256Collectives) {
  const std::vector<std::string> gloo = {"TANDEM_SHM=0"};
  auto plain = keys_launch_with(keys_cpu_config(2, ""), {"desync-after", "300"}, gloo);
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(keys_count(plain.out, "no desync caught"), 2) << plain.out << plain.err;

  auto shm = keys_launch_with(keys_cpu_config(2, ""), {"desync-after", "300"});
  EXPECT_NE(shm.exit_code, 0) << shm.out;
  EXPECT_NE(shm.err.find("rank 0 called all_reduce of 6 Float elements (sum) but rank 1 called "
                         "all_reduce of 6 Float elements (max)"),
            std::string::npos)
      << shm.err;

  auto debug =
      keys_launch_with(keys_cpu_config(2, "debug: true\n"), {"desync-after", "300"}, gloo);
  EXPECT_NE(debug.exit_code, 0) << debug.out;
  EXPECT_EQ(keys_count(debug.out, "no desync caught"), 0) << debug.out;
  EXPECT_NE(debug.err.find("collective desync at #"), std::string::npos) << debug.err;
  EXPECT_NE(debug.err.find("rank 0 called all_reduce Float[6] (sum) but rank 1 called "
                           "all_reduce Float[6] (max)"),
            std::string::npos)
      << debug.err;
}

// "0-2,5" -> {0, 1, 2, 5}.
std::set<int> keys_parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const auto dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int c = first; c <= last; ++c) cpus.insert(c);
  }
  return cpus;
}

// Each rank's Cpus_allowed_list, by local rank.
std::vector<std::set<int>> keys_worker_cpus(const std::string& out, int workers) {
  std::vector<std::set<int>> cpus(workers);
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    int rank = -1;
    char list[256] = {0};
    if (std::sscanf(line.c_str(), "rank %d Cpus_allowed_list: %255s", &rank, list) == 2 &&
        rank >= 0 && rank < workers) {
      cpus[rank] = keys_parse_cpu_list(list);
    }
  }
  return cpus;
}

std::set<int> keys_my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  ::sched_getaffinity(0, sizeof(set), &set);
  std::set<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  }
  return cpus;
}

TEST(LaunchTrainingKeys, CpuAffinityGivesEachLocalWorkerItsOwnCpus) {
  const std::set<int> allowed = keys_my_cpus();
  const int workers = 2;
  if (allowed.size() < static_cast<size_t>(workers)) {
    GTEST_SKIP() << "needs at least " << workers << " CPUs, this process may use "
                 << allowed.size();
  }
  auto plain = keys_launch_with(keys_cpu_config(workers, ""), {"cpus"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  for (const auto& cpus : keys_worker_cpus(plain.out, workers)) EXPECT_EQ(cpus, allowed) << plain.out;

  auto pinned = keys_launch_with(keys_cpu_config(workers, "enable_cpu_affinity: true\n"), {"cpus"});
  ASSERT_EQ(pinned.exit_code, 0) << pinned.err;
  const auto cpus = keys_worker_cpus(pinned.out, workers);
  std::set<int> all;
  size_t total = 0;
  for (const auto& share : cpus) {
    EXPECT_FALSE(share.empty()) << pinned.out;
    // Half of the CPUs each, give or take the one an odd count leaves.
    EXPECT_GE(share.size(), allowed.size() / workers) << pinned.out;
    all.insert(share.begin(), share.end());
    total += share.size();
  }
  EXPECT_EQ(total, all.size()) << "shares overlap: " << pinned.out;
  EXPECT_EQ(all, allowed) << pinned.out;
}

}  // namespace
}  // namespace tandem
