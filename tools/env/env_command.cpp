#include "env/env_command.h"

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "env/system_probe.h"
#include "tandem/core/error.h"
#include "tandem/core/rank_env.h"

namespace tandem::cli {

int run_env_command(int argc, char** argv) {
  CLI::App app{
      "Report versions, backends, devices, CPU, BLAS, threads, the rank environment and the "
      "config file in effect. Paste it into bug reports.",
      "tandem env"};
  bool json = false;
  app.add_flag("--json", json, "print one JSON object instead of text");
  if (auto done = parse_cli(app, argc, argv)) return *done;

  // A malformed rank environment is exactly what people run `tandem env` to
  // diagnose, so report it rather than fail.
  RankEnv env;
  std::string rank_env_error;
  try {
    env = RankEnv::from_environment();
  } catch (const UsageError& e) {
    rank_env_error = e.what();
  }
  SystemReport report = probe_system(env);
  report.rank_env_error = rank_env_error;

  std::string out = json ? to_json(report).dump(2) + "\n" : to_text(report);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace tandem::cli
