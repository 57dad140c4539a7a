// Python programs under `tandem launch`: a plain torch.distributed script
// (init_process_group("gloo") from the environment) runs as under torchrun,
// with its rendezvous store on loopback, on 2 and 3 ranks, and restarts with
// a fresh store.

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <string>
#include <vector>

#include "support/launch_testing.h"
#include "support/subprocess.h"

namespace tandem {
namespace python_programs_test {

using testing::launch;
using testing::run_process;

std::string script(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/launch/python/" + name;
}

bool peer_has_torch() {
  return run_process({TANDEM_PEER_PYTHON, "-c", "import torch.distributed"}, 60).exit_code == 0;
}

TEST(PythonUnderLaunch, APlainTorchDistributedScriptRunsAsUnderTorchrun) {
  if (!peer_has_torch()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " cannot import torch";
  for (int ranks : {2, 3}) {
    auto ours = run_process(
        launch({"--nproc-per-node", std::to_string(ranks), TANDEM_PEER_PYTHON, script("allreduce.py")}),
        180);
    ASSERT_EQ(ours.exit_code, 0) << ours.out << ours.err;
    auto theirs = run_process({TANDEM_PEER_PYTHON, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", std::to_string(ranks), script("allreduce.py")},
                              180);
    ASSERT_EQ(theirs.exit_code, 0) << theirs.out << theirs.err;
    const double sum = ranks * (ranks + 1) / 2.0;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string line = "rank " + std::to_string(rank) + "/" + std::to_string(ranks) +
                               " sum " + std::to_string(sum).substr(0, 3);
      EXPECT_NE(ours.out.find(line), std::string::npos) << line << "\n" << ours.out << ours.err;
      EXPECT_NE(theirs.out.find(line), std::string::npos) << line << "\n" << theirs.out;
    }
    // tandem's launcher keeps the store on loopback for a single node.
    EXPECT_NE(ours.out.find("store listens on 127.0.0.1\n"), std::string::npos) << ours.out;
  }
}

TEST(PythonUnderLaunch, ARestartedGroupRendezvousesAgainWithAFreshStore) {
  if (!peer_has_torch()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " cannot import torch";
  auto r = run_process(launch({"--nproc-per-node", "3", "--max-restarts", "1", TANDEM_PEER_PYTHON,
                               script("restart.py")}),
                       180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 0 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string line = "attempt 1 rank " + std::to_string(rank) + " sum 6.0";
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

// -m runs PROGRAM as a module, --run-path an executable file under Python,
// each as torchrun does; PYTHON_EXEC names the interpreter.
TEST(PythonUnderLaunch, ModuleAndRunPathRunUnderPython) {
  testing::TempDir dir;
  testing::write_text(dir.path() + "/rankmod.py",
                      "import os, sys\nprint('module', os.environ['RANK'], sys.argv[1:])\n");
  const std::string exe = dir.path() + "/exe.py";
  testing::write_text(exe, "import os\nprint('run_path', os.environ['RANK'])\n");
  ::chmod(exe.c_str(), 0755);  // no #! line: run directly, it would fail
  auto with_env = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {"env", "PYTHONPATH=" + dir.path(),
                                     std::string("PYTHON_EXEC=") + TANDEM_PEER_PYTHON};
    for (auto& a : launch(std::move(args))) argv.push_back(a);
    return run_process(argv, 120);
  };
  auto module = with_env({"--nproc-per-node", "2", "-m", "rankmod", "--lr", "1"});
  ASSERT_EQ(module.exit_code, 0) << module.out << module.err;
  EXPECT_NE(module.out.find("module 1 ['--lr', '1']"), std::string::npos) << module.out;
  auto run_path = with_env({"--nproc-per-node", "2", "--run-path", exe});
  ASSERT_EQ(run_path.exit_code, 0) << run_path.out << run_path.err;
  EXPECT_NE(run_path.out.find("run_path 1"), std::string::npos) << run_path.out;
}

// Python that tandem launch can see through (`env`, a "#!" line naming
// Python) gets its c10d store by itself; behind a wrapper it cannot see
// through (a shell script), --c10d-store asks for it, and without the flag
// the launcher says so when torch.distributed knocks on tandem's store.
TEST(PythonUnderLaunch, PythonBehindEnvAShebangOrAWrapperGetsItsStore) {
  if (!peer_has_torch()) GTEST_SKIP() << TANDEM_PEER_PYTHON << " cannot import torch";
  testing::TempDir dir;
  auto expect_sum = [](const testing::ProcessResult& r, const std::string& what) {
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("rank 1/2 sum 3.0"), std::string::npos) << what << "\n" << r.out;
  };
  expect_sum(run_process(launch({"--nproc-per-node", "2", "env", "PYTHONUNBUFFERED=1",
                                 TANDEM_PEER_PYTHON, script("allreduce.py")}),
                         180),
             "env");
  const std::string shebang = dir.path() + "/allreduce_script";
  testing::write_text(shebang, std::string("#!") + TANDEM_PEER_PYTHON + "\n" +
                                   testing::read_file(script("allreduce.py")));
  ::chmod(shebang.c_str(), 0755);
  expect_sum(run_process(launch({"--nproc-per-node", "2", shebang}), 180), "#! line");
  const std::string wrapper = dir.path() + "/wrapper.sh";
  testing::write_text(wrapper, std::string("#!/bin/sh\nexec ") + TANDEM_PEER_PYTHON + " \"$@\"\n");
  ::chmod(wrapper.c_str(), 0755);
  expect_sum(run_process(launch({"--nproc-per-node", "2", "--c10d-store", wrapper,
                                 script("allreduce.py")}),
                         180),
             "--c10d-store");
  // Without the flag: a client of c10d's protocol is refused, and told why.
  const std::string knock =
      "import datetime, os, torch.distributed as d\n"
      "try:\n"
      "    d.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), "
      "is_master=False, timeout=datetime.timedelta(seconds=3))\n"
      "except Exception as e:\n"
      "    print('refused:', type(e).__name__)\n";
  testing::write_text(dir.path() + "/knock.py", knock);
  auto refused = run_process(
      launch({"--nproc-per-node", "1", wrapper, dir.path() + "/knock.py"}), 180);
  EXPECT_NE(refused.out.find("refused:"), std::string::npos) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("add --c10d-store"), std::string::npos) << refused.err;
}

// A tandem YAML's training settings reach tandem programs only: a Python
// script is told which it will not see (they come to Accelerate as
// ACCELERATE_* variables, from an Accelerate config); a tandem program is not.
TEST(PythonUnderLaunch, IsToldWhichTandemYamlSettingsItDoesNotSee) {
  testing::TempDir dir;
  const std::string yaml = dir.path() + "/tandem.yaml";
  testing::write_text(yaml, "mixed_precision: bf16\ngradient_accumulation_steps: 4\n");
  const std::string py = dir.path() + "/show.py";
  testing::write_text(py, "import os\nprint('mp', os.environ.get('ACCELERATE_MIXED_PRECISION'))\n");
  auto r = run_process(launch({"--nproc-per-node", "1", "--config-file", yaml, TANDEM_PEER_PYTHON,
                               py}),
                       120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("mp None"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("a Python program gets its launch settings (processes, ranks, addresses) "
                       "but not mixed_precision bf16, gradient_accumulation_steps 4"),
            std::string::npos)
      << r.err;
  auto plain = run_process(launch({"--nproc-per-node", "1", "--config-file", yaml, "true"}), 120);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.err.find("a Python program"), std::string::npos) << plain.err;
}

}  // namespace python_programs_test
}  // namespace tandem
