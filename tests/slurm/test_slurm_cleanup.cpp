// Nothing left behind under Slurm: a job cancelled at a random point of
// training (with a checkpoint saved every step, so the cancel often lands in
// a save) leaves no process, /dev/shm segment or listening port on any
// host, and its last complete checkpoint loads.

#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "support/slurm_cluster.h"
#include "support/subprocess.h"
#include "tandem/comm/shm_cleanup.h"

namespace tandem {
namespace {

using testing::BackgroundProcess;
using testing::bin;
using testing::read_file;
using testing::run_process;
using testing::wait_for_files;
using testing::SlurmCluster;

// tandem's segments in /dev/shm whose creator is gone.
std::set<std::string> orphaned_segments() {
  std::set<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind("tandem-", 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + 7, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0) out.insert(name);
  }
  ::closedir(dir);
  return out;
}

void cancel_and_check(const std::string& how) {
  SlurmCluster slurm(2);
  if (!slurm.ok()) GTEST_SKIP() << "skipped: " << slurm.why();
  const std::string dir = slurm.shared();
  const std::string ckpt = dir + "/ckpt";
  const std::set<std::string> orphans_before = orphaned_segments();
  std::random_device seed;
  const int at = std::uniform_int_distribution<int>(3, 30)(seed);
  SCOPED_TRACE("scancel (" + how + ") after step " + std::to_string(at));
  std::vector<std::string> argv = {"srun", "-N2", "--ntasks-per-node=2"};
  if (how == "launch") {
    argv = {"srun", "-N2", "--ntasks-per-node=1", bin("tandem"), "launch", "--nproc-per-node",
            "2"};
  }
  for (const std::string& a :
       {bin("quickstart_worker"), std::string("200"), std::string("24"),
        dir + "/out.safetensors", ckpt, std::string("1")}) {
    argv.push_back(a);
  }
  BackgroundProcess job(slurm.login(argv), {"TANDEM_STORE_TOKEN=" + std::string(64, 'c'),
                                            "TANDEM_TEST_STEP_DELAY_MS=20", "TANDEM_TIMEOUT_S=60"});
  const std::string out = job.out_path();
  const std::string line = "step " + std::to_string(at) + "\n";
  wait_for_files(out.substr(0, out.rfind('/')),
                 [&] { return read_file(out).find(line) != std::string::npos; }, 120);
  ASSERT_NE(read_file(job.out_path()).find("step " + std::to_string(at)), std::string::npos)
      << read_file(job.out_path()) << read_file(job.err_path());
  auto cancel = run_process(slurm.login({"scancel", "--user=root"}), 30);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  job.wait(60);
  // Slurm's KillWait (5 s here) then SIGKILL; slurmstepd leaves after that.
  std::string left;
  for (int tries = 0; tries < 150; ++tries) {
    left.clear();
    for (int host = 0; host < slurm.size(); ++host) left += slurm.leftovers(host);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(left, "") << "left on the hosts after scancel";
  std::set<std::string> leaked;
  for (const auto& name : orphaned_segments()) {
    if (!orphans_before.count(name)) leaked.insert(name);
  }
  EXPECT_TRUE(leaked.empty()) << "segments in /dev/shm of dead processes: " << *leaked.begin();
  for (const auto& name : leaked) remove_shared_memory_of(std::atoi(name.c_str() + 7));
  // The last complete checkpoint loads (here on one process).
  auto resumed = run_process({bin("quickstart_worker"), "200", "24", dir + "/one.safetensors",
                              ckpt, "0"},
                             120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed at step "), std::string::npos) << resumed.out;
}

TEST(SlurmCleanup, ScancelOfSrunTasksLeavesNothingAndTheLastCheckpointLoads) {
  cancel_and_check("srun");
}

TEST(SlurmCleanup, ScancelOfOneLauncherPerNodeLeavesNothingAndTheLastCheckpointLoads) {
  cancel_and_check("launch");
}

}  // namespace
}  // namespace tandem
