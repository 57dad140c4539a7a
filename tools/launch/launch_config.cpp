// How a config file fills the launch settings no flag gave
// (launch_options.h: choose_config_file, apply_launch_config,
// default_zero_stage).

#include <algorithm>
#include <cstdio>

#include "launch/cpu_affinity.h"
#include "launch/launch_options.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem::cli {

std::string choose_config_file(const LaunchOptions& opts, const ConfigEnv& env) {
  const std::string path = select_config_file(opts.config_file, env);
  if (path.empty()) return "";
  try {
    return fs::absolute(path);
  } catch (const Error&) {  // no working directory: leave the path as given
    return path;
  }
}

void apply_launch_config(const Config& config, int local_gpus, LaunchOptions& opts) {
  opts.cpu_affinity = opts.cpu_affinity || config.enable_cpu_affinity;
  opts.debug_detail = config.debug;
  // A host the head started (--env-from-stdin) runs its own slots: the head
  // has read the hostfile keys, and passes the config on only for the rest.
  if (opts.hostfile.empty() && !opts.env_from_stdin && !config.deepspeed_hostfile.empty()) {
    const std::string& how = config.deepspeed_multinode_launcher;
    if (how.empty() || how == "pdsh") {
      // Accelerate would start DeepSpeed's pdsh runner here; tandem fans out
      // over ssh itself (host_fanout.h).
      opts.hostfile = config.deepspeed_hostfile;
      if (opts.include.empty() && opts.exclude.empty()) {
        opts.include = config.deepspeed_inclusion_filter;
        opts.exclude = config.deepspeed_exclusion_filter;
      }
    } else if (how == "standard") {
      std::fprintf(stderr,
                   "tandem launch: %s: deepspeed_hostfile is not used: "
                   "deepspeed_multinode_launcher is standard, so each machine runs its own "
                   "launcher (as with Accelerate)\n",
                   config.source_path.c_str());
    } else {
      TANDEM_THROW(UsageError,
                   "{}: deepspeed_multinode_launcher {} is not supported: tandem launch starts "
                   "a deepspeed_hostfile's hosts over ssh (pdsh, or leave the key out). Under "
                   "Slurm, run one `tandem launch` per node with srun, or start the program "
                   "directly with srun (docs/slurm.md); under mpirun, start the program "
                   "directly: tandem reads OMPI_* and SLURM_*",
                   config.source_path, how);
    }
  }
  if (config.preemption.enabled && !opts.grace_period_given) {
    // The workers finish their step and save after a SIGTERM; Slurm's
    // KillWait, not the launcher, bounds how long that may take.
    opts.grace_period_s = 600;
  }
  if (!opts.standalone) {
    // A hostfile job's head numbers the hosts from the file.
    if (!opts.nnodes_given && opts.hostfile.empty()) opts.nnodes = config.num_machines;
    if (!opts.node_rank_given && opts.hostfile.empty()) {
      opts.node_rank = config.machine_rank;
      // A config for several machines names this one's rank.
      opts.node_rank_given = config.num_machines > 1;
    }
    if (!opts.master_addr_given && !config.main_process_ip.empty()) {
      opts.master_addr = config.main_process_ip;
      opts.master_addr_in_config = true;
    }
    if (!opts.master_port_given && config.main_process_port) {
      opts.master_port = *config.main_process_port;
      opts.master_port_in_config = true;
    }
    // The reader has refused any rdzv_backend but static and c10d.
    if (!opts.rdzv_backend_given && opts.hostfile.empty()) opts.rdzv_backend = config.rdzv_backend;
  }
  const bool filtered = !opts.include.empty() || !opts.exclude.empty();
  if (!opts.nproc_given && !filtered && config.num_processes) {
    const int total = *config.num_processes;
    TANDEM_CHECK_ARG(opts.nnodes >= 1 && total % opts.nnodes == 0 && total >= opts.nnodes,
                     "{}: num_processes {} counts the processes of all {} machines (as "
                     "Accelerate does) and must split evenly over them; make it a multiple of "
                     "{}, or give --nproc-per-node",
                     config.source_path, total, opts.nnodes, opts.nnodes);
    opts.nproc_per_node = total / opts.nnodes;
  }
  // --gpu_ids beats the file's gpu_ids.
  const std::string gpu_ids =
      opts.gpu_ids_given ? (opts.visible_devices.empty() ? "all" : opts.visible_devices)
                         : config.gpu_ids;
  const bool listed = !gpu_ids.empty() && gpu_ids != "all";
  if (!filtered && listed && !opts.gpu_ids_given) opts.visible_devices = config.gpu_ids;
  // A GPU config without a count (or `num_processes: auto`) runs one
  // process per GPU of this node, as `accelerate launch` and `deepspeed` do.
  const bool gpu_job = config.distributed_type == DistributedType::kMultiGpu ||
                       ((config.distributed_type == DistributedType::kDeepSpeed ||
                         config.distributed_type == DistributedType::kFsdp) &&
                        !config.use_cpu);
  if (!opts.nproc_given && !filtered && !config.num_processes && gpu_job) {
    int gpus = local_gpus;
    if (listed) gpus = 1 + static_cast<int>(std::count(gpu_ids.begin(), gpu_ids.end(), ','));
    opts.nproc_per_node = std::max(1, gpus);
  }
  // `num_processes: auto` on CPUs: one process per CPU the launcher may
  // use, as --nproc-per-node cpu (the file asks for the count at launch).
  const bool decided_at_launch =
      !config.num_processes && config.key_locations.count("num_processes") > 0;
  if (!opts.nproc_given && !filtered && decided_at_launch &&
      config.distributed_type == DistributedType::kMultiCpu) {
    opts.nproc_per_node = std::max(1, static_cast<int>(allowed_cpus().size()));
  }
}

void default_zero_stage(const Config* config, LaunchOptions& opts) {
  if (!opts.use_deepspeed || opts.zero_stage) return;
  if (config == nullptr || config->zero.stage == 0) opts.zero_stage = 2;
}

}  // namespace tandem::cli
