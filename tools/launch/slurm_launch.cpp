#include "launch/slurm_launch.h"

#include <fmt/format.h>

#include "tandem/core/error.h"

namespace tandem::cli {
namespace {

// Both ways to run under Slurm, for the errors below.
std::string ways_to_run(const SlurmStep& step, const LaunchOptions& opts) {
  return fmt::format(
      "Run one launcher per node: `srun --ntasks-per-node=1 tandem launch --nproc-per-node {} "
      "PROGRAM`, or let srun start every worker itself: `srun --ntasks-per-node={} PROGRAM` "
      "(docs/slurm.md)",
      opts.nproc_per_node, std::max(opts.nproc_per_node, step.local_tasks()));
}

}  // namespace

std::string apply_slurm_step(const std::optional<SlurmStep>& step, LaunchOptions& opts) {
  if (!step || !opts.hostfile.empty() || opts.standalone || opts.env_from_stdin) return "";
  if (step->in_batch_script()) {
    // The batch script itself, on the job's first node only.
    if (step->num_nodes() == 1 || opts.nnodes_given) return "";
    TANDEM_THROW(UsageError,
                 "tandem launch runs in the batch script of {}, outside srun: it would start "
                 "workers on the first of the job's {} nodes only, while the others idle. {}. "
                 "To train on this node alone, give --nnodes 1",
                 step->describe(), step->num_nodes(), ways_to_run(*step, opts));
  }
  const bool nodes_given = opts.nnodes_given && (opts.node_rank_given || opts.nnodes == 1);
  if (step->local_tasks() > 1 && !nodes_given) {
    TANDEM_THROW(UsageError,
                 "srun started {} tasks on this node ({}, SLURM_STEP_TASKS_PER_NODE), and each "
                 "would be a `tandem launch` starting its own {} worker(s): {} separate jobs "
                 "instead of one. {}",
                 step->local_tasks(), step->describe(), opts.nproc_per_node,
                 step->num_tasks, ways_to_run(*step, opts));
  }
  std::string taken;
  auto note = [&](const std::string& what) { taken += (taken.empty() ? "" : ", ") + what; };
  if (!opts.nnodes_given) {
    opts.nnodes = step->num_nodes();
    opts.nnodes_given = true;
    note(fmt::format("--nnodes {}", opts.nnodes));
  }
  const bool elastic = opts.rdzv_backend_given && opts.rdzv_backend == "c10d";
  if (!opts.node_rank_given && !elastic && opts.nnodes > 1) {
    opts.node_rank = step->node_id;
    opts.node_rank_given = true;
    note(fmt::format("--node-rank {} (SLURM_NODEID)", opts.node_rank));
  }
  if (!opts.master_addr_given && opts.nnodes > 1) {
    opts.master_addr = step->hosts.front();
    opts.master_addr_given = true;
    note(fmt::format("--master-addr {} (the step's first host)", opts.master_addr));
  }
  if (!opts.master_port_given && opts.nnodes > 1) {
    opts.master_port = slurm_step_port(step->job_id, step->step_id);
    opts.master_port_given = true;
    note(fmt::format("--master-port {} (from the job and step id)", opts.master_port));
  }
  return fmt::format("tandem launch: {}: {}{}", step->describe(),
                     taken.empty() ? "every node setting from flags" : taken,
                     taken.empty() ? "" : "; flags override these");
}

}  // namespace tandem::cli
