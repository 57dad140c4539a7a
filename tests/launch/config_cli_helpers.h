#pragma once
// Helpers for the `tandem config` and `tandem launch --config-file` tests:
// run tandem in a throwaway home, with no config variables inherited from
// the environment the tests run in.

#include <fstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "support/launch_testing.h"  // file_exists
#include "support/subprocess.h"

namespace tandem::testing {

// argv running `tandem ARGS` with HOME=`home`, XDG_CACHE_HOME and HF_HOME
// unset and no TANDEM_* config variables, plus `vars` ("NAME=VALUE").
inline std::vector<std::string> tandem_in(const std::string& home, std::vector<std::string> args,
                                          const std::vector<std::string>& vars = {}) {
  std::vector<std::string> argv = {"env"};
  for (const char* name : {"TANDEM_CONFIG_FILE", "TANDEM_MIXED_PRECISION",
                           "TANDEM_GRADIENT_ACCUMULATION_STEPS", "TANDEM_SEED", "TANDEM_ZERO_STAGE",
                           "TANDEM_OFFLOAD_OPTIMIZER_DEVICE", "TANDEM_OFFLOAD_PARAM_DEVICE",
                           "TANDEM_GRADIENT_CLIPPING", "XDG_CACHE_HOME", "HF_HOME"}) {
    argv.insert(argv.end(), {"-u", name});
  }
  argv.push_back("HOME=" + home);
  argv.insert(argv.end(), vars.begin(), vars.end());
  argv.push_back(bin("tandem"));
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// `argv` with its standard input read from the file `input`.
inline std::vector<std::string> with_stdin(const std::string& input, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$@\" < \"$0\"", input});
  return argv;
}

// Writes `text` to `path`, creating the parent folders.
inline void write_text(const std::string& path, const std::string& text) {
  (void)!std::system(("mkdir -p \"$(dirname '" + path + "')\"").c_str());
  std::ofstream(path) << text;
}

}  // namespace tandem::testing
