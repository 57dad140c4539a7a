#pragma once
// The message of the UsageError a call throws: what tests of bad input
// compare against.

#include <functional>
#include <string>

#include "tandem/core/error.h"

namespace tandem::testing {

// The UsageError's message, or "" when `fn` throws none (another exception
// propagates and fails the test).
inline std::string usage_error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace tandem::testing
