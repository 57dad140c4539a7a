#pragma once

namespace tandem::cli {

// `tandem launch [options] PROGRAM [ARGS...]`: argv[0] is "launch".
// Returns the launcher's exit code.
int run_launch_command(int argc, char** argv);

}  // namespace tandem::cli
