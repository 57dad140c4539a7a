#pragma once
// CLI11 parsing shared by the subcommands: --help prints and ends the
// command (exit 0); a bad flag is a UsageError (exit 2).

#include <cstdio>
#include <optional>

#include <CLI/CLI.hpp>

#include "tandem/core/error.h"

namespace tandem::cli {

// Returns an exit code when the command is over (--help), nullopt to go on.
inline std::optional<int> parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    TANDEM_THROW(UsageError, "{}. Run `{} --help` for the options", e.what(), app.get_name());
  }
  return std::nullopt;
}

}  // namespace tandem::cli
