#pragma once
// Version of tandem and of the LibTorch it was built against.

#include <string>

namespace tandem {

// "0.1.0"
const char* version();

// LibTorch version as compiled in, e.g. "2.13.0".
std::string torch_version();

}  // namespace tandem
