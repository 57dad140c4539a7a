#pragma once
// The variables `accelerate launch` gives its workers (ACCELERATE_*, FSDP_*,
// PARALLELISM_CONFIG_*), so that a Python script built on HF Accelerate and
// started by `tandem launch --config-file F` sees what `accelerate launch
// --config_file F` would have shown it. tandem's own programs do not read
// them: they read the config file itself (TANDEM_CONFIG_FILE).

#include <map>
#include <string>

#include "launch/launch_options.h"

namespace tandem::cli {

// The variables for `accelerate_yaml` (an Accelerate config file; empty:
// none) with `opts`'s flags, as accelerate 1.15's launch_command sets them:
// the launcher path follows --use_deepspeed / --multi-gpu, else the file's
// distributed_type (DEEPSPEED: DeepSpeed's; FSDP, MULTI_GPU: torchrun's;
// NO, MULTI_CPU: the simple launcher's), and each value is formatted as
// Python's str() would (True/False, 1.0, ['A', 'B']), lowercased where
// Accelerate lowercases it. Without a file and without --use_deepspeed:
// nothing. Throws UsageError when the file cannot be read.
std::map<std::string, std::string> accelerate_worker_env(const std::string& accelerate_yaml,
                                                         const LaunchOptions& opts);

}  // namespace tandem::cli
