#include "tandem/core/error.h"

#include <cstring>

#include "tandem/core/logging.h"

namespace tandem {

Error::Error(const std::string& message) : std::runtime_error(message) {}

namespace detail {

std::string decorate_error(const std::string& message, const char* file, int line) {
  if (file == nullptr) return rank_prefix() + message;
  const char* base = std::strrchr(file, '/');
  return fmt::format("{}{} ({}:{})", rank_prefix(), message, base ? base + 1 : file, line);
}

}  // namespace detail
}  // namespace tandem
