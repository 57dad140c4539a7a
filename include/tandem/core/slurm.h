#pragma once
// What a process learns from the Slurm step it runs in: the step's hosts,
// tasks per host, and this task's place among them. Read by RankEnv (one
// process per task: `srun ./train`) and by `tandem launch` (one launcher per
// node: `srun --ntasks-per-node=1 tandem launch ...`).

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

// Expands a Slurm host list, as SLURM_JOB_NODELIST writes it, into host
// names in order: "n[1-3,7]" -> n1 n2 n3 n7; "gpu-[01-04]" keeps the zero
// padding; groups separated by commas ("a[1-2],b"); several brackets in one
// name ("rack[1-2]-n[01-02]", the first bracket outermost). Throws
// UsageError, naming the list, when it is malformed (an unclosed bracket, a
// range that runs backwards, an empty name).
std::vector<std::string> expand_slurm_host_list(const std::string& list);

// Expands a tasks-per-node list ("2(x3),1", SLURM_STEP_TASKS_PER_NODE's
// form) into one count per node: 2 2 2 1. Throws UsageError when malformed.
std::vector<int> expand_slurm_tasks_per_node(const std::string& list);

// The rendezvous port of a Slurm step that sets no MASTER_PORT, the same on
// every node and task of the step: 15000 + the job id's last four digits +
// 10000 x (the step id mod 5). Step 0 and the batch script (no step id) get
// PyTorch Lightning's port (15000 + the last four digits); two jobs sharing
// a node differ unless their ids end in the same four digits, and up to 5
// steps of one job running at once differ. Ports of steps 1-4 (25000-64999)
// lie partly in Linux's default ephemeral range (32768-60999). Throws
// UsageError naming SLURM_JOB_ID or SLURM_STEP_ID when one is not a number.
int slurm_step_port(const std::string& job_id, const std::string& step_id);

// What `scontrol show job -o JOB` says of the job's BatchFlag: true for a
// job sbatch submitted (the only kind Slurm requeues), false for one srun or
// salloc started; nullopt when the text has no BatchFlag (scontrol failed).
std::optional<bool> slurm_batch_flag(const std::string& scontrol_show_job);

// One task's view of the Slurm step it runs in.
struct SlurmStep {
  std::string job_id;             // SLURM_JOB_ID
  std::string step_id;            // SLURM_STEP_ID; empty in a batch script outside srun
  std::string node_list;          // SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, as written
  std::vector<std::string> hosts;  // node_list expanded
  std::vector<int> tasks_per_node;  // one count per host
  int node_id = 0;                // SLURM_NODEID: this host's index in `hosts`
  int proc_id = 0;                // SLURM_PROCID: this task's rank in the step
  int local_id = 0;               // SLURM_LOCALID: this task's index on its host
  int num_tasks = 1;              // SLURM_STEP_NUM_TASKS, else SLURM_NTASKS
  int cpus_per_task = 0;          // SLURM_CPUS_PER_TASK; 0 when not given
  int restart_count = 0;          // SLURM_RESTART_COUNT: times the job was requeued

  int num_nodes() const { return static_cast<int>(hosts.size()); }
  // The batch script itself (sbatch), outside any srun step: one process on
  // the job's first node, whatever the job's task count says.
  bool in_batch_script() const { return step_id.empty() && !job_id.empty(); }
  // Tasks Slurm started on this task's host.
  int local_tasks() const { return tasks_per_node.at(static_cast<std::size_t>(node_id)); }
  // "job 12.0 on n[0-1]: node 1 of 2, task 3 of 4": for messages.
  std::string describe() const;
  // "12.0", or "12.batch" in the batch script: which run of the job this
  // process belongs to, for the rendezvous store's handshake
  // (StoreServerOptions::run_scope).
  std::string name() const { return job_id + "." + (step_id.empty() ? "batch" : step_id); }

  // The step this process runs in, read from `vars` (the environment);
  // nullopt outside Slurm (no SLURM_JOB_ID, or no SLURM_PROCID). Throws
  // UsageError, naming the variable, when a value is malformed or the
  // values disagree (a node id past the host list, a task count that is not
  // the sum of the tasks per node).
  static std::optional<SlurmStep> from_map(const std::map<std::string, std::string>& vars);
  // Same, from the process environment.
  static std::optional<SlurmStep> from_environment();
};

}  // namespace tandem
