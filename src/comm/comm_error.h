#pragma once
// Turns exceptions from c10d/Gloo into tandem's typed errors.

#include <chrono>
#include <exception>
#include <functional>
#include <string>

namespace tandem::detail {

// Rethrows the active exception as TimeoutError or CommError whose message
// names the collective (`what`, e.g. "all_reduce #12 float[1024]"), the
// timeout, and what to check. On a timeout, `explain_timeout` (when given)
// says which ranks did not arrive. tandem errors pass through, except a
// TimeoutError that can be explained. Call only inside a catch block.
[[noreturn]] void rethrow_as_comm_error(const std::string& what, std::chrono::milliseconds timeout,
                                        const std::function<std::string()>& explain_timeout = nullptr);

// "3 s" for whole seconds, else "1500 ms".
std::string format_timeout(std::chrono::milliseconds timeout);

}  // namespace tandem::detail
