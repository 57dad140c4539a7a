// Slurm's host lists, tasks-per-node lists and step environment, as
// srun and sbatch write them.

#include <gtest/gtest.h>

#include <set>

#include "support/usage_error.h"
#include "tandem/core/error.h"
#include "tandem/core/rank_env.h"
#include "tandem/core/slurm.h"

namespace tandem {
namespace {

using Hosts = std::vector<std::string>;
using testing::usage_error_message;

// The call throws a UsageError whose message contains `part`.
#define EXPECT_USAGE_ERROR(call, part)                                 \
  do {                                                                 \
    const std::string message = usage_error_message([&] { (void)(call); }); \
    EXPECT_NE(message.find(part), std::string::npos)                   \
        << "message: '" << message << "', expected it to contain: " << (part); \
  } while (0)

TEST(SlurmHostList, ExpandsRangesListsPaddingAndSeveralGroups) {
  EXPECT_EQ(expand_slurm_host_list("solo"), Hosts{"solo"});
  EXPECT_EQ(expand_slurm_host_list("h[1-3,7]"), (Hosts{"h1", "h2", "h3", "h7"}));
  EXPECT_EQ(expand_slurm_host_list("gpu-[01-04]"), (Hosts{"gpu-01", "gpu-02", "gpu-03", "gpu-04"}));
  EXPECT_EQ(expand_slurm_host_list("node[098-101]"),
            (Hosts{"node098", "node099", "node100", "node101"}));
  EXPECT_EQ(expand_slurm_host_list("a[1-2],b,c[5]"), (Hosts{"a1", "a2", "b", "c5"}));
  EXPECT_EQ(expand_slurm_host_list("x[2,4],y[1-3]"), (Hosts{"x2", "x4", "y1", "y2", "y3"}));
  EXPECT_EQ(expand_slurm_host_list("rack[1-2]-n[01-02]"),
            (Hosts{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand_slurm_host_list("n0.cluster,n1.cluster"), (Hosts{"n0.cluster", "n1.cluster"}));
  // slurm_first_host() agrees with the expansion.
  for (const std::string list : {"node[003-005,9]", "a,b,c", "x[2,4],y[1-3]", "gpu-[01-04]"}) {
    EXPECT_EQ(slurm_first_host(list), expand_slurm_host_list(list).front()) << list;
  }
}

TEST(SlurmHostList, RefusesMalformedListsNamingThem) {
  for (const std::string list : {"h[1-3", "h1-3]", "h[3-1]", "h[a-b]", "a,,b", ",a", "h[]",
                                 "h[1-]", "a b"}) {
    EXPECT_USAGE_ERROR(expand_slurm_host_list(list), "'" + list + "'");
  }
}

TEST(SlurmTasksPerNode, ExpandsRepeats) {
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_tasks_per_node("1,2,1"), (std::vector<int>{1, 2, 1}));
  for (const std::string list : {"2(x", "(x2)", "x", "2(x2", ""}) {
    EXPECT_USAGE_ERROR(expand_slurm_tasks_per_node(list), "'" + list + "'");
  }
}

TEST(SlurmStepPort, StepZeroKeepsLightningsRuleAndStaysInItsRange) {
  EXPECT_EQ(slurm_step_port("12", "0"), 15012);
  EXPECT_EQ(slurm_step_port("123456", "0"), 18456);
  EXPECT_EQ(slurm_step_port("9999", "0"), 24999);
  EXPECT_EQ(slurm_step_port("9999", ""), 24999);  // the batch script: no step
  EXPECT_EQ(slurm_step_port("9999", "4"), 64999);  // the highest it gives
}

TEST(SlurmStepPort, AJobIdThatIsNotANumberIsAnErrorNamingTheVariable) {
  EXPECT_USAGE_ERROR(slurm_step_port("abc", "0"), "SLURM_JOB_ID='abc'");
  EXPECT_USAGE_ERROR(slurm_step_port("", "0"), "SLURM_JOB_ID=''");
  EXPECT_USAGE_ERROR(slurm_step_port("12", "x"), "SLURM_STEP_ID='x'");
}

// As srun -N2 --ntasks-per-node=2 sets it for the last task.
std::map<std::string, std::string> srun_task() {
  return {{"SLURM_JOB_ID", "42"},          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", "n[0-1]"}, {"SLURM_STEP_NODELIST", "n[0-1]"},
          {"SLURM_STEP_NUM_TASKS", "4"},    {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_NODEID", "1"},           {"SLURM_PROCID", "3"},
          {"SLURM_LOCALID", "1"},          {"SLURM_CPUS_PER_TASK", "2"}};
}

TEST(SlurmStep, ReadsAnSrunTask) {
  auto step = SlurmStep::from_map(srun_task());
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->hosts, (Hosts{"n0", "n1"}));
  EXPECT_EQ(step->tasks_per_node, (std::vector<int>{2, 2}));
  EXPECT_EQ(step->num_tasks, 4);
  EXPECT_EQ(step->node_id, 1);
  EXPECT_EQ(step->proc_id, 3);
  EXPECT_EQ(step->local_id, 1);
  EXPECT_EQ(step->local_tasks(), 2);
  EXPECT_EQ(step->cpus_per_task, 2);
  EXPECT_EQ(step->describe(), "Slurm job 42.0 on n[0-1]: node 1 of 2, task 3 of 4");
  EXPECT_EQ(step->name(), "42.0");
  EXPECT_FALSE(SlurmStep::from_map({{"SLURM_PROCID", "0"}}).has_value());
  EXPECT_FALSE(SlurmStep::from_map({}).has_value());
}

// sbatch's script runs outside any step, with the job's task count: a
// program it starts directly is alone, not rank 0 of a world that never
// comes.
TEST(SlurmStep, AProgramTheBatchScriptRunsDirectlyIsAlone) {
  auto vars = srun_task();
  vars.erase("SLURM_STEP_ID");
  vars.erase("SLURM_STEP_NODELIST");
  vars.erase("SLURM_STEP_NUM_TASKS");
  vars.erase("SLURM_STEP_TASKS_PER_NODE");
  vars["SLURM_NODEID"] = "0";
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_LOCALID"] = "0";
  auto step = SlurmStep::from_map(vars);
  ASSERT_TRUE(step.has_value());
  EXPECT_TRUE(step->in_batch_script());
  EXPECT_EQ(step->describe(), "Slurm job 42 (batch script) on n[0-1]: node 0 of 2, task 0 of 4");
  EXPECT_EQ(step->name(), "42.batch");
  const RankEnv env = RankEnv::from_map(vars);
  EXPECT_FALSE(env.launched());
  EXPECT_EQ(env.world_size, 1);
}

// Two srun steps of one job running at once on one node (job 10068's steps
// a and b): each step's tasks agree on one port, and the steps' ports
// differ, as do two jobs'.
TEST(SlurmStep, TwoStepsOfOneJobDeriveDifferentPortsEveryTaskOfAStepTheSame) {
  auto task = [](const std::string& job, const std::string& step, int node, int proc) {
    auto vars = srun_task();
    vars["SLURM_JOB_ID"] = job;
    vars["SLURM_STEP_ID"] = step;
    vars["SLURM_NODEID"] = std::to_string(node);
    vars["SLURM_PROCID"] = std::to_string(proc);
    vars["SLURM_LOCALID"] = std::to_string(proc % 2);
    return RankEnv::from_map(vars);
  };
  EXPECT_EQ(task("10068", "0", 0, 0).master_port, 15068);
  EXPECT_EQ(task("10068", "0", 1, 3).master_port, 15068);
  EXPECT_EQ(task("10068", "1", 0, 0).master_port, task("10068", "1", 1, 3).master_port);
  std::set<int> ports;
  for (const std::string step : {"0", "1", "2", "3", "4"}) {
    ports.insert(task("10068", step, 1, 2).master_port);
  }
  EXPECT_EQ(ports.size(), 5u) << "steps 0-4 of one job must not share a port";
  for (const std::string step : {"0", "1", "2", "3", "4"}) {
    EXPECT_EQ(ports.count(task("10069", step, 0, 0).master_port), 0u) << step;
  }
  EXPECT_EQ(task("10068", "1", 0, 0).slurm_step, "10068.1");
  // MASTER_PORT wins, and then the job id is not read for a port.
  auto vars = srun_task();
  vars["MASTER_PORT"] = "29511";
  vars["SLURM_JOB_ID"] = "abc";
  EXPECT_EQ(RankEnv::from_map(vars).master_port, 29511);
}

TEST(SlurmStep, AJobIdThatIsNotANumberIsAnErrorNotPort15000) {
  auto vars = srun_task();
  vars["SLURM_JOB_ID"] = "abc";
  EXPECT_USAGE_ERROR(RankEnv::from_map(vars), "SLURM_JOB_ID='abc'");
}

TEST(SlurmStep, UnevenTasksPerNodeGiveEachNodeItsOwnCount) {
  auto vars = srun_task();
  vars["SLURM_STEP_NODELIST"] = "n[0-2]";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2,1(x2)";
  vars["SLURM_NODEID"] = "2";
  vars["SLURM_LOCALID"] = "0";
  auto step = SlurmStep::from_map(vars);
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->num_nodes(), 3);
  EXPECT_EQ(step->local_tasks(), 1);
}

TEST(SlurmStep, RefusesAnInconsistentEnvironmentNamingTheVariable) {
  auto vars = srun_task();
  vars["SLURM_NODEID"] = "2";
  EXPECT_USAGE_ERROR(SlurmStep::from_map(vars), "SLURM_NODEID=2");
  vars = srun_task();
  vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x3)";
  EXPECT_USAGE_ERROR(SlurmStep::from_map(vars), "SLURM_STEP_TASKS_PER_NODE");
  vars = srun_task();
  vars["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  EXPECT_USAGE_ERROR(SlurmStep::from_map(vars), "adds up to 2 tasks");
  vars = srun_task();
  vars["SLURM_LOCALID"] = "2";
  EXPECT_USAGE_ERROR(SlurmStep::from_map(vars), "SLURM_LOCALID=2");
  vars = srun_task();
  vars["SLURM_CPUS_PER_TASK"] = "two";
  EXPECT_USAGE_ERROR(SlurmStep::from_map(vars), "SLURM_CPUS_PER_TASK='two'");
}

}  // namespace
}  // namespace tandem
