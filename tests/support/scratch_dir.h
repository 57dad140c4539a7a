#pragma once
// A fresh directory under gtest's temp dir, removed with its contents when
// the object goes. mkdtemp makes the name unique per process and call, so
// tests running in parallel (ctest -j, shuffled order) never share one.

#include <stdlib.h>

#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include "tandem/core/file_system.h"

namespace tandem::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string templ = ::testing::TempDir() + "tandem_test_XXXXXX";
    path_ = ::mkdtemp(templ.data()) ? templ : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string operator/(const std::string& name) const { return file(name); }

 private:
  std::string path_;
};

}  // namespace tandem::testing
