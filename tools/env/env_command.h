#pragma once

namespace tandem::cli {

// `tandem env [--json]`: argv[0] is "env". Returns the exit code.
int run_env_command(int argc, char** argv);

}  // namespace tandem::cli
