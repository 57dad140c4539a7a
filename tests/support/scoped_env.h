#pragma once
// Environment variables set (or unset) for one test, and restored when the
// object goes, in reverse order. Not thread-safe: set them before starting
// rank threads.
//
//   testing::ScopedEnv env;
//   env.set("MLFLOW_TRACKING_URI", server.uri().c_str());
//   env.set("MLFLOW_RUN_ID", nullptr);  // unset for this test

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::testing {

class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  // Sets `name` to `value`; nullptr unsets it.
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      it->second ? ::setenv(it->first.c_str(), it->second->c_str(), 1)
                 : ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace tandem::testing
