// `tandem`: the command-line front end. Maps errors to exit codes:
// 0 success, 1 failure at run time, 2 bad input (UsageError).

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "checkpoint/checkpoint_command.h"
#include "config/config_command.h"
#include "env/env_command.h"
#include "estimate/estimate_memory_command.h"
#include "launch/launch_command.h"
#include "tandem/core/error.h"
#include "tandem/core/version.h"

namespace {

void print_usage() {
  std::printf(
      "usage: tandem <command> [options]\n"
      "\n"
      "commands:\n"
      "  launch           start a multi-process job (torchrun-compatible flags)\n"
      "  config           write a config by answering questions; `config check FILE`\n"
      "                   validates one, `config default` writes a basic one, `config\n"
      "                   keys` lists every key tandem reads\n"
      "  env              report versions, backends, devices, BLAS and the rank environment\n"
      "  estimate-memory  model-state memory per rank for DDP and ZeRO stages 1-3\n"
      "  checkpoint       `checkpoint inspect DIR` lists a checkpoint's tags; `checkpoint\n"
      "                   merge DIR OUT.safetensors` writes its consolidated weights;\n"
      "                   `checkpoint import` brings a DeepSpeed folder or a torch.save\n"
      "                   file over\n"
      "\n"
      "Run `tandem <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  try {
    if (command == "--version" || command == "version") {
      std::printf("tandem %s (LibTorch %s)\n", tandem::version(), tandem::torch_version().c_str());
      return 0;
    }
    if (command == "launch") return tandem::cli::run_launch_command(argc - 1, argv + 1);
    if (command == "env") return tandem::cli::run_env_command(argc - 1, argv + 1);
    if (command == "config") return tandem::cli::run_config_command(argc - 1, argv + 1);
    if (command == "checkpoint") return tandem::cli::run_checkpoint_command(argc - 1, argv + 1);
    if (command == "estimate-memory") {
      return tandem::cli::run_estimate_memory_command(argc - 1, argv + 1);
    }
    std::fprintf(stderr, "tandem: unknown command '%s'\n\n", command.c_str());
    print_usage();
    return 2;
  } catch (const tandem::UsageError& e) {
    std::fprintf(stderr, "tandem %s: error: %s\n", command.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
