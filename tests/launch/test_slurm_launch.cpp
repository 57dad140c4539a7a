// `tandem launch` inside a Slurm job, as settings: what it reads from the
// step, what flags override, and the launches it refuses because Slurm
// would split them into separate jobs. The real cluster is in
// tests/slurm/.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "launch/launch_options.h"
#include "launch/slurm_launch.h"
#include "support/usage_error.h"
#include "tandem/core/error.h"
#include "tandem/core/slurm.h"

namespace tandem {
namespace {

using cli::apply_slurm_step;
using cli::LaunchOptions;
using testing::usage_error_message;

// The step of `srun -N2 --ntasks-per-node=TASKS` (job 7301), as node `node`
// sees it.
SlurmStep srun_step(int node, int tasks_per_node, const std::string& step_id = "0") {
  std::map<std::string, std::string> vars = {
      {"SLURM_JOB_ID", "7301"},
      {"SLURM_JOB_NODELIST", "gpu-[07-08]"},
      {"SLURM_STEP_NODELIST", "gpu-[07-08]"},
      {"SLURM_STEP_NUM_TASKS", std::to_string(2 * tasks_per_node)},
      {"SLURM_STEP_TASKS_PER_NODE", std::to_string(tasks_per_node) + "(x2)"},
      {"SLURM_NODEID", std::to_string(node)},
      {"SLURM_PROCID", std::to_string(node * tasks_per_node)},
      {"SLURM_LOCALID", "0"}};
  if (!step_id.empty()) vars["SLURM_STEP_ID"] = step_id;
  return *SlurmStep::from_map(vars);
}

LaunchOptions slurm_launch_flags(std::vector<std::string> args) {
  args.insert(args.begin(), "launch");
  args.push_back("./train");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return cli::parse_launch_flags(static_cast<int>(argv.size()), argv.data(), &help);
}

TEST(SlurmLaunch, OneLauncherPerNodeBecomesThatNodeOfTheStep) {
  for (int node : {0, 1}) {
    LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2"});
    const std::string told = apply_slurm_step(srun_step(node, 1), opts);
    EXPECT_EQ(opts.nnodes, 2);
    EXPECT_EQ(opts.node_rank, node);
    EXPECT_EQ(opts.master_addr, "gpu-07");
    EXPECT_EQ(opts.master_port, slurm_step_port("7301", "0"));
    EXPECT_EQ(opts.master_port, 22301);
    EXPECT_NE(told.find("Slurm job 7301.0 on gpu-[07-08]: node " + std::to_string(node) + " of 2"),
              std::string::npos)
        << told;
    EXPECT_NE(told.find("--master-addr gpu-07"), std::string::npos) << told;
    cli::validate_launch_options(opts);  // a complete multi-node launch
  }
}

TEST(SlurmLaunch, FlagsTheUserGaveWin) {
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2", "--master-addr", "10.0.0.9",
                              "--master-port", "29999"});
  const std::string told = apply_slurm_step(srun_step(1, 1), opts);
  EXPECT_EQ(opts.master_addr, "10.0.0.9");
  EXPECT_EQ(opts.master_port, 29999);
  EXPECT_EQ(opts.node_rank, 1);
  EXPECT_EQ(told.find("--master-addr"), std::string::npos) << told;

  // --rdzv-backend c10d: the nodes agree on their ranks at the store.
  opts = slurm_launch_flags({"--nproc-per-node", "2", "--rdzv-backend", "c10d"});
  apply_slurm_step(srun_step(1, 1), opts);
  EXPECT_FALSE(opts.node_rank_given);
  EXPECT_TRUE(cli::rendezvous_at_store(opts));

  // --standalone: this node alone, whatever the step (but see below).
  opts = slurm_launch_flags({"--standalone", "--nproc-per-node", "2"});
  apply_slurm_step(srun_step(1, 1), opts);
  EXPECT_EQ(opts.nnodes, 1);
}

// srun -N2 ... tandem launch --standalone: two separate world-2 jobs writing
// the same outputs. Said, not silent.
TEST(SlurmLaunch, StandaloneInAMultiNodeStepWarnsThatEachNodeRunsItsOwnJob) {
  LaunchOptions opts = slurm_launch_flags({"--standalone", "--nproc-per-node", "2"});
  const std::string told = apply_slurm_step(srun_step(1, 1), opts);
  EXPECT_NE(told.find("warning: --standalone in Slurm job 7301.0"), std::string::npos) << told;
  EXPECT_NE(told.find("each of the step's 2 nodes runs its own separate single-node job"),
            std::string::npos)
      << told;
}

// srun -N1 ... tandem launch (jobs 10048 and 10049 on one node): each job
// its own port, not 29500 for both.
TEST(SlurmLaunch, ASingleNodeStepTakesTheJobsPortNot29500) {
  auto one_node = [](const std::string& job) {
    return *SlurmStep::from_map({{"SLURM_JOB_ID", job},
                                 {"SLURM_STEP_ID", "0"},
                                 {"SLURM_STEP_NODELIST", "n1"},
                                 {"SLURM_STEP_NUM_TASKS", "1"},
                                 {"SLURM_STEP_TASKS_PER_NODE", "1"},
                                 {"SLURM_NODEID", "0"},
                                 {"SLURM_PROCID", "0"},
                                 {"SLURM_LOCALID", "0"}});
  };
  LaunchOptions a = slurm_launch_flags({"--nproc-per-node", "2"});
  LaunchOptions b = slurm_launch_flags({"--nproc-per-node", "2"});
  const std::string told = apply_slurm_step(one_node("10048"), a);
  apply_slurm_step(one_node("10049"), b);
  EXPECT_EQ(a.nnodes, 1);
  EXPECT_EQ(a.master_port, 15048);
  EXPECT_EQ(b.master_port, 15049);
  EXPECT_NE(told.find("--master-port 15048"), std::string::npos) << told;
  cli::validate_launch_options(a);
  // --master-port, or MASTER_PORT, wins.
  LaunchOptions given = slurm_launch_flags({"--nproc-per-node", "2", "--master-port", "29999"});
  apply_slurm_step(one_node("10048"), given);
  EXPECT_EQ(given.master_port, 29999);
  LaunchOptions from_env = slurm_launch_flags({"--nproc-per-node", "2"});
  apply_slurm_step(one_node("10048"), from_env, "29511");
  EXPECT_EQ(from_env.master_port, 29511);
  LaunchOptions bad = slurm_launch_flags({"--nproc-per-node", "2"});
  const std::string message =
      usage_error_message([&] { apply_slurm_step(one_node("10048"), bad, "abc"); });
  EXPECT_NE(message.find("MASTER_PORT='abc' is not a port number (1-65535)"), std::string::npos)
      << message;
}

// Two steps of one job at once (job 10068's steps a and b): their launchers
// must not meet at one store.
TEST(SlurmLaunch, TwoStepsOfOneJobTakeDifferentPorts) {
  LaunchOptions step0 = slurm_launch_flags({"--nproc-per-node", "2"});
  LaunchOptions step1 = slurm_launch_flags({"--nproc-per-node", "2"});
  apply_slurm_step(srun_step(0, 1, "0"), step0);
  const std::string told = apply_slurm_step(srun_step(1, 1, "1"), step1);
  EXPECT_NE(step0.master_port, step1.master_port);
  EXPECT_EQ(step1.master_port, slurm_step_port("7301", "1"));
  EXPECT_NE(told.find("(from the job and step id)"), std::string::npos) << told;
}

TEST(SlurmLaunch, ANodeCountOtherThanTheStepsIsAnErrorNamingBoth) {
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2", "--nnodes", "3"});
  const std::string message =
      usage_error_message([&] { apply_slurm_step(srun_step(0, 1), opts); });
  EXPECT_NE(message.find("--nnodes 3 does not match Slurm job 7301.0"), std::string::npos)
      << message;
  EXPECT_NE(message.find("SLURM_STEP_NODELIST=gpu-[07-08]"), std::string::npos) << message;
  EXPECT_NE(message.find("srun starts 2 launcher(s)"), std::string::npos) << message;
  // An elastic range the step can reach, and the step's own count, are fine.
  opts = slurm_launch_flags({"--nproc-per-node", "2", "--nnodes", "1:3", "--rdzv-backend", "c10d"});
  EXPECT_NO_THROW(apply_slurm_step(srun_step(0, 1), opts));
  opts = slurm_launch_flags({"--nproc-per-node", "2", "--nnodes", "2"});
  EXPECT_NO_THROW(apply_slurm_step(srun_step(0, 1), opts));
}

TEST(SlurmLaunch, ANodeRankOtherThanSlurmNodeidIsSaid) {
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2", "--node-rank", "0"});
  const std::string told = apply_slurm_step(srun_step(1, 1), opts);
  EXPECT_NE(told.find("--node-rank 0 here, but this is node 1 of the step (SLURM_NODEID)"),
            std::string::npos)
      << told;
  opts = slurm_launch_flags({"--nproc-per-node", "2", "--node-rank", "1"});
  EXPECT_EQ(apply_slurm_step(srun_step(1, 1), opts).find("warning"), std::string::npos);
}

TEST(SlurmLaunch, AJobIdThatIsNotANumberIsAnErrorNamingTheVariable) {
  std::map<std::string, std::string> vars = {
      {"SLURM_JOB_ID", "abc"},         {"SLURM_STEP_ID", "0"},
      {"SLURM_STEP_NODELIST", "n1"},   {"SLURM_STEP_NUM_TASKS", "1"},
      {"SLURM_STEP_TASKS_PER_NODE", "1"}, {"SLURM_NODEID", "0"},
      {"SLURM_PROCID", "0"},           {"SLURM_LOCALID", "0"}};
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2"});
  const std::string message =
      usage_error_message([&] { apply_slurm_step(SlurmStep::from_map(vars), opts); });
  EXPECT_NE(message.find("SLURM_JOB_ID='abc'"), std::string::npos) << message;
}

TEST(SlurmLaunch, SeveralTasksPerNodeIsAnErrorNamingBothWaysToRun) {
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2"});
  const std::string message =
      usage_error_message([&] { apply_slurm_step(srun_step(0, 2), opts); });
  EXPECT_NE(message.find("srun started 2 tasks on this node"), std::string::npos) << message;
  EXPECT_NE(message.find("4 separate jobs"), std::string::npos) << message;
  EXPECT_NE(message.find("srun --ntasks-per-node=1 tandem launch --nproc-per-node 2"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("srun --ntasks-per-node=2 PROGRAM"), std::string::npos) << message;
  // With every node setting given, the user has taken charge.
  opts = slurm_launch_flags({"--nproc-per-node", "1", "--nnodes", "4", "--node-rank", "0"});
  EXPECT_NO_THROW(apply_slurm_step(srun_step(0, 2), opts));
}

TEST(SlurmLaunch, AMultiNodeBatchScriptOutsideSrunIsAnError) {
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2"});
  const std::string message =
      usage_error_message([&] { apply_slurm_step(srun_step(0, 1, /*step_id=*/""), opts); });
  EXPECT_NE(message.find("outside srun"), std::string::npos) << message;
  EXPECT_NE(message.find("first of the job's 2 nodes"), std::string::npos) << message;
  EXPECT_NE(message.find("--nnodes 1"), std::string::npos) << message;
  // On this node alone, with the job's port (two such jobs may share it).
  opts = slurm_launch_flags({"--nproc-per-node", "2", "--nnodes", "1"});
  apply_slurm_step(srun_step(0, 1, ""), opts);
  EXPECT_EQ(opts.master_port, slurm_step_port("7301", ""));
}

TEST(SlurmLaunch, OutsideSlurmNothingChanges) {
  LaunchOptions opts = slurm_launch_flags({"--nproc-per-node", "2"});
  EXPECT_EQ(apply_slurm_step(std::nullopt, opts), "");
  EXPECT_EQ(opts.nnodes, 1);
  EXPECT_EQ(opts.master_addr, "127.0.0.1");
}

}  // namespace
}  // namespace tandem
