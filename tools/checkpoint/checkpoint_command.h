#pragma once

namespace tandem::cli {

// `tandem checkpoint merge DIR OUT.safetensors [--tag T] [--dtype fp32|bf16|fp16]`,
// `tandem checkpoint merge DIR OUT_DIR --max-shard-size 2GB [...]`
// `tandem checkpoint inspect DIR [--json]` and
// `tandem checkpoint import SRC.pt OUT.safetensors` (see checkpoint_command.cpp).
// argv[0] is "checkpoint". Returns the exit code; throws UsageError (exit 2)
// for bad input and CheckpointError (exit 1) for a missing or corrupt
// checkpoint.
int run_checkpoint_command(int argc, char** argv);

}  // namespace tandem::cli
