#include "launch/python_store.h"

namespace tandem::cli {

bool is_python_program(const std::vector<std::string>& program) {
  if (program.empty()) return false;
  const std::string& exe = program[0];
  const std::string base = exe.substr(exe.rfind('/') == std::string::npos ? 0 : exe.rfind('/') + 1);
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, ".py") == 0) return true;
  if (base.rfind("python", 0) != 0) return false;
  return base.find_first_not_of("0123456789.", 6) == std::string::npos;
}

}  // namespace tandem::cli
