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

std::string apply_slurm_step(const std::optional<SlurmStep>& step, LaunchOptions& opts,
                             const char* master_port_env) {
  if (!step || !opts.hostfile.empty() || opts.env_from_stdin) return "";
  if (opts.standalone) {
    if (step->in_batch_script() || step->num_nodes() == 1) return "";
    // One world of one node per launcher: the step's nodes train apart.
    return fmt::format(
        "tandem launch: warning: --standalone in {}: each of the step's {} nodes runs its own "
        "separate single-node job, and they write the same outputs. Drop --standalone to train "
        "as one job across the step's nodes, or run srun -N1",
        step->describe(), step->num_nodes());
  }
  std::string taken;
  auto note = [&](const std::string& what) { taken += (taken.empty() ? "" : ", ") + what; };
  auto take_port = [&] {
    if (opts.master_port_given) return;
    if (master_port_env != nullptr) {
      const std::string text = master_port_env;
      const bool digits = !text.empty() && text.size() <= 5 &&
                          text.find_first_not_of("0123456789") == std::string::npos;
      TANDEM_CHECK_ARG(digits && std::stoi(text) >= 1 && std::stoi(text) <= 65535,
                       "MASTER_PORT='{}' is not a port number (1-65535); fix or unset it",
                       text);
      opts.master_port = std::stoi(text);
      note(fmt::format("--master-port {} (MASTER_PORT)", opts.master_port));
    } else {
      opts.master_port = slurm_step_port(step->job_id, step->step_id);
      note(fmt::format("--master-port {} (from the job and step id)", opts.master_port));
    }
    opts.master_port_given = true;
  };
  if (step->in_batch_script()) {
    // The batch script itself, on the job's first node only.
    if (step->num_nodes() == 1 || opts.nnodes_given) {
      if (opts.nnodes == 1) take_port();
      return taken.empty() ? "" : fmt::format("tandem launch: {}: {}", step->describe(), taken);
    }
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
  // srun starts one launcher per task of the step: a count they cannot
  // reach (or, for static nodes, one that leaves some out) would only time
  // out waiting at the store.
  const bool elastic = opts.rdzv_backend_given && opts.rdzv_backend == "c10d";
  const int needed = opts.min_nodes > 0 ? opts.min_nodes : opts.nnodes;
  const bool fits = needed == 1 || (elastic || opts.min_nodes > 0
                                        ? needed <= step->num_tasks
                                        : opts.nnodes == step->num_tasks);
  TANDEM_CHECK_ARG(!opts.nnodes_given || fits,
                   "--nnodes {} does not match {}: srun starts {} launcher(s) in this step "
                   "(SLURM_STEP_NODELIST={}, SLURM_STEP_NUM_TASKS={}), so the job would wait at "
                   "its store for nodes that never come. Drop --nnodes to take the step's {}, or "
                   "give srun (and the job) -N{}",
                   opts.min_nodes > 0 ? fmt::format("{}:{}", opts.min_nodes, opts.nnodes)
                                      : std::to_string(opts.nnodes),
                   step->describe(), step->num_tasks, step->node_list, step->num_tasks,
                   step->num_tasks, needed);
  if (!opts.nnodes_given) {
    opts.nnodes = step->num_nodes();
    opts.nnodes_given = true;
    note(fmt::format("--nnodes {}", opts.nnodes));
  }
  std::string warning;
  if (!opts.node_rank_given && !elastic && opts.nnodes > 1) {
    opts.node_rank = step->node_id;
    opts.node_rank_given = true;
    note(fmt::format("--node-rank {} (SLURM_NODEID)", opts.node_rank));
  } else if (opts.node_rank_given && opts.nnodes > 1 && step->num_tasks == step->num_nodes() &&
             opts.node_rank != step->node_id) {
    warning = fmt::format(
        "\ntandem launch: warning: --node-rank {} here, but this is node {} of the step "
        "(SLURM_NODEID): srun gives every node the same command line, so another node is "
        "probably --node-rank {} too. Drop --node-rank to take SLURM_NODEID",
        opts.node_rank, step->node_id, opts.node_rank);
  }
  if (!opts.master_addr_given && opts.nnodes > 1) {
    opts.master_addr = step->hosts.front();
    opts.master_addr_given = true;
    note(fmt::format("--master-addr {} (the step's first host)", opts.master_addr));
  }
  take_port();
  return fmt::format("tandem launch: {}: {}{}{}", step->describe(),
                     taken.empty() ? "every node setting from flags" : taken,
                     taken.empty() ? "" : "; flags override these", warning);
}

}  // namespace tandem::cli
