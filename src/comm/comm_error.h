#pragma once
// Turns exceptions from c10d/Gloo into tandem's typed errors.

#include <chrono>
#include <exception>
#include <string>

namespace tandem::detail {

// Rethrows the active exception as TimeoutError or CommError whose message
// names the collective (`what`, e.g. "all_reduce #12 float[1024]"), the
// timeout, and what to check. Call only inside a catch block.
[[noreturn]] void rethrow_as_comm_error(const std::string& what, std::chrono::milliseconds timeout);

}  // namespace tandem::detail
