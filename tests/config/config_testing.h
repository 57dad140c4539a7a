#pragma once
// Helpers shared by the config tests.

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tandem/core/file_system.h"
#include "tandem/config/config.h"
#include "tandem/core/error.h"

namespace tandem::testing {

// tests/config/data, found from the data folder CMake points at.
inline std::string config_data_dir() {
  return std::string(TANDEM_TEST_DATA_DIR) + "/../../config/data";
}

inline std::string config_data(const std::string& file) { return config_data_dir() + "/" + file; }

// The message of the UsageError `body` throws; a test failure if it throws
// nothing or something else.
inline std::string usage_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a UsageError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a UsageError, nothing was thrown";
  return "";
}

// The UsageError message for loading tests/config/data/`file`.
inline std::string load_error(const std::string& file) {
  return usage_error([&] { load_config_file(config_data(file)); });
}

// The UsageError message for parsing `text` as the file `name`.
inline std::string parse_error(const std::string& text, const std::string& name,
                               const std::string& base_dir = ".") {
  return usage_error([&] { parse_config_text(text, name, base_dir); });
}

// The keys of `config`'s warnings that name a key ("FILE:L:C: 'PATH' ..."),
// sorted: what a file asked for that tandem does not do.
inline std::vector<std::string> warned_keys(const Config& config) {
  std::vector<std::string> out;
  for (const auto& warning : config.warnings) {
    const auto open = warning.find(": '");
    if (open == std::string::npos) continue;
    const auto close = warning.find('\'', open + 3);
    if (close != std::string::npos) out.push_back(warning.substr(open + 3, close - open - 3));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A fresh folder under the test temp dir, removed afterwards.
class TempFolder {
 public:
  TempFolder() {
    std::string pattern = ::testing::TempDir() + "tandem_config_XXXXXX";
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempFolder() {
    if (!path_.empty()) fs::remove_all(path_);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;

  const std::string& path() const { return path_; }
  // Writes `text` to `relative` (creating its folders); returns the path.
  std::string write(const std::string& relative, const std::string& text = "seed: 1\n") const {
    std::filesystem::path file = std::filesystem::path(path_) / relative;
    fs::create_directories(file.parent_path().string());
    std::FILE* f = std::fopen(file.c_str(), "w");
    if (f) {
      std::fputs(text.c_str(), f);
      std::fclose(f);
    }
    return file.string();
  }

 private:
  std::string path_;
};

inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not found in:\n  " << text;
}

}  // namespace tandem::testing
