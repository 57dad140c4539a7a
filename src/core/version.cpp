#include "tandem/core/version.h"

#include <torch/version.h>

#include <fmt/format.h>

#ifndef TANDEM_VERSION_STRING
#define TANDEM_VERSION_STRING "0.0.0"
#endif

namespace tandem {

const char* version() { return TANDEM_VERSION_STRING; }

std::string torch_version() {
  return fmt::format("{}.{}.{}", TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
}

}  // namespace tandem
