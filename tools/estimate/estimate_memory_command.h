#pragma once

namespace tandem::cli {

// `tandem estimate-memory --params P [--world-size N] [--mixed-precision M]
// [--offload] [--gpus-per-node G] [--json]`: prints the model-state bytes per
// rank for DDP and ZeRO stages 1-3 (estimate/estimate_memory.h has the
// formulas). argv[0] is "estimate-memory". Returns the exit code; throws
// UsageError (exit 2) for bad input.
int run_estimate_memory_command(int argc, char** argv);

}  // namespace tandem::cli
