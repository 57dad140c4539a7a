#pragma once
// `tandem launch` inside a Slurm job: one launcher per node
// (`srun --ntasks-per-node=1 tandem launch --nproc-per-node K ./train`)
// becomes node SLURM_NODEID of the step's nodes, with the first host of the
// step's node list as master. Flags the user gave win; a launch Slurm would
// split into separate jobs (several tasks per node, or a multi-node batch
// script outside srun) is an error that names both ways to run.

#include <optional>
#include <string>

#include "launch/launch_options.h"
#include "tandem/core/slurm.h"

namespace tandem::cli {

// Fills the node settings no flag gave (--nnodes, --node-rank,
// --master-addr, --master-port) from `step`, before the config file fills
// the rest. The port is `master_port_env` (MASTER_PORT; nullptr when unset)
// if given, else the step's (slurm_step_port), also on one node, so that
// two jobs sharing a node do not collide. Returns what the launcher prints
// about what it read, warnings included ("" when `step` is empty or the
// launch does not use it: --hostfile). Throws UsageError for a launch that
// would run as several separate jobs or cannot match the step (--nnodes
// other than the step's node count), and for a malformed MASTER_PORT.
std::string apply_slurm_step(const std::optional<SlurmStep>& step, LaunchOptions& opts,
                             const char* master_port_env = nullptr);

}  // namespace tandem::cli
