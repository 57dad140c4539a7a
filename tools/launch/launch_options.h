#pragma once
// Options of `tandem launch`, spelled as torchrun spells them.

#include <string>
#include <vector>

namespace tandem::cli {

struct LaunchOptions {
  int nproc_per_node = 1;
  bool nproc_given = false;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: the launcher picks a free port
  bool standalone = false;
  int max_restarts = 0;  // accepted; restarts arrive in a later release
  std::string log_dir;
  int tee = 0;        // 1 stdout, 2 stderr, 3 both: to files and console
  int redirects = 0;  // 1 stdout, 2 stderr, 3 both: to files only
  bool prefix_output = true;
  std::string include;  // DeepSpeed host filter, e.g. "host:0,1@host2:2"
  std::string exclude;
  double grace_period_s = 3.0;  // SIGTERM -> SIGKILL
  std::vector<std::string> program;  // PROGRAM followed by its arguments
};

// Parses argv (argv[0] is "launch"). Options may be written with dashes or
// underscores (--nproc-per-node, --nproc_per_node) and as "--opt value" or
// "--opt=value". Everything from the first non-option argument (or after
// "--") is the program and its arguments. Throws UsageError on bad input;
// returns nullopt-like empty program after printing help for --help.
LaunchOptions parse_launch_options(int argc, char** argv, bool* help_printed);

}  // namespace tandem::cli
