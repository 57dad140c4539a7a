#pragma once
// What tandem logs to stderr while `body` runs, at log level info (the
// level is put back after, also when `body` throws).

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "tandem/core/logging.h"

namespace tandem::testing {

inline std::string info_log_of(const std::function<void()>& body) {
  const LogLevel level = log_level();
  set_log_level(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  try {
    body();
  } catch (...) {
    ::testing::internal::GetCapturedStderr();
    set_log_level(level);
    throw;
  }
  std::string text = ::testing::internal::GetCapturedStderr();
  set_log_level(level);
  return text;
}

}  // namespace tandem::testing
