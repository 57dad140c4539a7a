// tandem_test_workers: the worker programs the tests drive, in one binary
// that compiles as one translation unit (each program as its own costs about
// 13 s of CPU on the slowest machine just to load the precompiled LibTorch
// headers). The build links each program's name to it in bin/; the name it
// runs under picks the program.

#include <cstdio>
#include <cstring>
#include <string>

namespace checkpoint_worker { int main(int argc, char** argv); }
namespace comm_calls_worker { int main(int argc, char** argv); }
namespace consistency_worker { int main(int argc, char** argv); }
namespace fault_worker { int main(int argc, char** argv); }
namespace hierarchical_test_worker { int main(int argc, char** argv); }
namespace launch_test_worker { int main(int argc, char** argv); }
namespace print_config_keys { int main(int argc, char** argv); }
namespace quickstart_worker { int main(int argc, char** argv); }

namespace {

struct Program {
  const char* name;
  int (*main)(int, char**);
};

constexpr Program kPrograms[] = {
    {"checkpoint_worker", checkpoint_worker::main},
    {"comm_calls_worker", comm_calls_worker::main},
    {"consistency_worker", consistency_worker::main},
    {"fault_worker", fault_worker::main},
    {"hierarchical_test_worker", hierarchical_test_worker::main},
    {"launch_test_worker", launch_test_worker::main},
    {"print_config_keys", print_config_keys::main},
    {"quickstart_worker", quickstart_worker::main},
};

}  // namespace

int main(int argc, char** argv) {
  std::string name = argc > 0 ? argv[0] : "";
  if (const auto slash = name.rfind('/'); slash != std::string::npos) name.erase(0, slash + 1);
  for (const Program& program : kPrograms) {
    if (name == program.name) return program.main(argc, argv);
  }
  // Run directly: the first argument names the program.
  if (argc > 1) {
    for (const Program& program : kPrograms) {
      if (std::strcmp(argv[1], program.name) == 0) return program.main(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "tandem_test_workers: run as one of");
  for (const Program& program : kPrograms) std::fprintf(stderr, " %s", program.name);
  std::fprintf(stderr, " (a link named so, as the build makes in bin/), or give the name as the "
                       "first argument\n");
  return 2;
}
