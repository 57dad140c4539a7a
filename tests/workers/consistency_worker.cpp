// Worker for the start-up consistency faults (tests/faults): ranks that
// disagree on their config or their model, as after a stale config copy on
// one node or a rank-dependent branch in model code.
//
//   consistency_worker config DIR    rank R reads DIR/rank<R>.yaml when it
//                                    exists, else DIR/config.yaml
//   consistency_worker model RANK    rank RANK builds fc as Linear(5, 10),
//                                    the others Linear(4, 10)
//
// Each rank builds an Accelerator (and, for `model`, prepares the model),
// then prints "rank R/N consistent" and exits 0. An error is recorded in the
// launcher's error file, printed, and ends the worker with code 1.
// With TANDEM_TEST_PID_DIR set, each rank first writes its pid to
// DIR/rank<R>.pid, so tests can check that no worker survives.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "tandem/tandem.h"

// One of the programs in tandem_test_workers (workers/main.cpp picks it by
// the name it runs under).
namespace consistency_worker {

namespace {

void write_pid(int rank) {
  const char* dir = std::getenv("TANDEM_TEST_PID_DIR");
  if (dir == nullptr) return;
  std::ofstream(std::string(dir) + "/rank" + std::to_string(rank) + ".pid") << ::getpid();
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

struct Net : torch::nn::Module {
  explicit Net(int in) { fc = register_module("fc", torch::nn::Linear(in, 10)); }
  torch::nn::Linear fc{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "config" && std::string(argv[1]) != "model")) {
    std::fprintf(stderr, "usage: consistency_worker config DIR | model RANK\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string arg = argv[2];
  try {
    const tandem::RankEnv env = tandem::RankEnv::from_environment();
    write_pid(env.rank);
    tandem::AcceleratorOptions options;
    options.cpu = true;
    if (mode == "config") {
      const std::string own = arg + "/rank" + std::to_string(env.rank) + ".yaml";
      options.config_file = exists(own) ? own : arg + "/config.yaml";
    }
    tandem::Accelerator accelerator(options);
    if (mode == "model") {
      accelerator.prepare_model(std::make_shared<Net>(env.rank == std::atoi(arg.c_str()) ? 5 : 4));
    }
    std::printf("rank %d/%d consistent\n", env.rank, env.world_size);
    return 0;
  } catch (const std::exception& e) {
    tandem::record_error(e);
    std::fprintf(stderr, "consistency_worker: %s\n", e.what());
    return 1;
  }
}

}  // namespace consistency_worker
