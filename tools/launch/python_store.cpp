#include "launch/python_store.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tandem::cli {
namespace {

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// python, python3, python3.11, ...
bool is_python_interpreter(const std::string& name) {
  const std::string base = base_name(name);
  if (base.rfind("python", 0) != 0) return false;
  return base.find_first_not_of("0123456789.", 6) == std::string::npos;
}

// Whether the file's "#!" line runs a Python interpreter (directly or
// through env).
bool has_python_shebang(const std::string& exe) {
  const std::string path = executable_path(exe);
  if (path.empty()) return false;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!std::getline(in, line) || line.rfind("#!", 0) != 0) return false;
  std::stringstream words(line.substr(2));
  std::string word;
  while (words >> word) {
    if (is_python_interpreter(word)) return true;
    if (base_name(word) != "env" && word.rfind('-', 0) != 0) return false;
  }
  return false;
}

}  // namespace

std::string executable_path(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? program : "";
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  // Every entry, an empty one (the working directory) at either end too.
  for (size_t start = 0; start <= dirs.size();) {
    const size_t colon = dirs.find(':', start);
    const std::string dir =
        dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

bool is_python_program(const std::vector<std::string>& program) {
  std::size_t first = 0;
  // `env [-i] [NAME=VALUE]... PROGRAM`: the program env runs.
  if (!program.empty() && base_name(program[0]) == "env") {
    first = 1;
    while (first < program.size() && (program[first].rfind('-', 0) == 0 ||
                                      program[first].find('=') != std::string::npos)) {
      ++first;
    }
  }
  if (first >= program.size()) return false;
  const std::string& exe = program[first];
  const std::string base = base_name(exe);
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, ".py") == 0) return true;
  return is_python_interpreter(exe) || has_python_shebang(exe);
}

}  // namespace tandem::cli
