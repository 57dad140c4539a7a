// tandem::fs: the POSIX file operations tandem uses instead of
// std::filesystem's (include/tandem/core/file_system.h says why).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/scratch_dir.h"
#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

namespace tandem {
namespace {

void touch(const std::string& path, const std::string& text = "x") {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

TEST(FileSystem, CreateDirectoriesMakesEveryMissingParentAndAcceptsAnExistingOne) {
  testing::ScratchDir dir;
  const std::string deep = dir / "a/b/c";
  fs::create_directories(deep);
  EXPECT_TRUE(fs::is_directory(deep));
  EXPECT_NO_THROW(fs::create_directories(deep));
  EXPECT_NO_THROW(fs::create_directories(deep + "/"));
  touch(dir / "file");
  std::error_code ec;
  fs::create_directories(dir / "file", ec);
  EXPECT_TRUE(ec);
  try {
    fs::create_directories(dir / "file/below");
    ADD_FAILURE() << "a path through a file was created";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "file/below"), std::string::npos) << e.what();
  }
}

TEST(FileSystem, RemoveAllRemovesATreeWithoutFollowingSymbolicLinks) {
  testing::ScratchDir dir;
  fs::create_directories(dir / "keep");
  touch(dir / "keep/precious");
  fs::create_directories(dir / "tree/sub/subsub");
  touch(dir / "tree/a");
  touch(dir / "tree/sub/b");
  touch(dir / "tree/sub/subsub/c");
  ASSERT_EQ(::symlink((dir / "keep").c_str(), (dir / "tree/sub/link").c_str()), 0);
  fs::remove_all(dir / "tree");
  EXPECT_FALSE(fs::exists(dir / "tree"));
  EXPECT_TRUE(fs::is_regular_file(dir / "keep/precious")) << "remove_all followed a link";
  EXPECT_NO_THROW(fs::remove_all(dir / "tree"));  // missing: nothing to do
  touch(dir / "single");
  fs::remove_all(dir / "single");
  EXPECT_FALSE(fs::exists(dir / "single"));
}

TEST(FileSystem, ListDirectoryGivesSortedNamesAndEmptinessAndErrors) {
  testing::ScratchDir dir;
  EXPECT_TRUE(fs::is_empty_directory(dir.path()));
  for (const char* name : {"b", "a", "c.txt"}) touch(dir / name);
  fs::create_directories(dir / "d");
  EXPECT_EQ(fs::list_directory(dir.path()), (std::vector<std::string>{"a", "b", "c.txt", "d"}));
  EXPECT_FALSE(fs::is_empty_directory(dir.path()));
  EXPECT_FALSE(fs::is_empty_directory(dir / "a"));  // a file is not an empty directory
  EXPECT_FALSE(fs::is_empty_directory(dir / "missing"));
  std::error_code ec;
  EXPECT_TRUE(fs::list_directory(dir / "missing", ec).empty());
  EXPECT_EQ(ec, std::errc::no_such_file_or_directory);
  EXPECT_THROW(fs::list_directory(dir / "missing"), Error);
}

TEST(FileSystem, ExistsAndKindFollowLinks) {
  testing::ScratchDir dir;
  touch(dir / "f");
  fs::create_directories(dir / "d");
  ASSERT_EQ(::symlink((dir / "d").c_str(), (dir / "l").c_str()), 0);
  ASSERT_EQ(::symlink((dir / "gone").c_str(), (dir / "dangling").c_str()), 0);
  EXPECT_TRUE(fs::exists(dir / "f"));
  EXPECT_TRUE(fs::is_regular_file(dir / "f"));
  EXPECT_FALSE(fs::is_directory(dir / "f"));
  EXPECT_TRUE(fs::is_directory(dir / "l"));
  EXPECT_FALSE(fs::exists(dir / "dangling"));
  EXPECT_FALSE(fs::exists(dir / "missing"));
}

TEST(FileSystem, RenameRemoveAndDirectories) {
  testing::ScratchDir dir;
  touch(dir / "from", "payload");
  fs::rename(dir / "from", dir / "to");
  EXPECT_FALSE(fs::exists(dir / "from"));
  EXPECT_TRUE(fs::is_regular_file(dir / "to"));
  std::error_code ec;
  fs::rename(dir / "missing", dir / "x", ec);
  EXPECT_TRUE(ec);
  EXPECT_THROW(fs::rename(dir / "missing", dir / "x"), Error);
  fs::remove(dir / "to");
  EXPECT_FALSE(fs::exists(dir / "to"));
  EXPECT_NO_THROW(fs::remove(dir / "to"));

  const std::string before = fs::current_directory();
  fs::change_directory(dir.path());
  EXPECT_EQ(fs::absolute("x/../y"), dir / "y");
  fs::change_directory(before);
  EXPECT_EQ(fs::current_directory(), before);
  EXPECT_EQ(fs::absolute("/a/./b/../c"), "/a/c");
  EXPECT_THROW(fs::change_directory(dir / "missing"), Error);
}

}  // namespace
}  // namespace tandem
