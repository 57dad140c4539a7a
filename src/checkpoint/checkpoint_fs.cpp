#include "checkpoint/checkpoint_fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "tandem/core/error.h"
#include "tandem/core/file_system.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace tandem::detail {
namespace {

[[noreturn]] void throw_os(const char* what, const std::string& path, int err) {
  TANDEM_THROW(CheckpointError, "{} '{}' failed: {}{}", what, path, std::strerror(err),
               err == ENOSPC ? " (free some space or save to another directory)" : "");
}

int open_or_throw(const std::string& path, int flags, mode_t mode = 0644) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_os("opening", path, errno);
  return fd;
}

}  // namespace

void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = open_or_throw(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (const int err = fs::write_all(fd, text.data(), text.size()); err != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    throw_os("writing", path, err);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    throw_os("fsync of", path, err);
  }
  if (::close(fd) != 0) throw_os("closing", path, errno);
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TANDEM_THROW(CheckpointError, "cannot open '{}': {}", path, std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void fsync_directory(const std::string& dir) {
  const int fd = open_or_throw(dir, O_RDONLY | O_DIRECTORY);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (e.g. certain FUSE mounts) refuse fsync on
  // directories; their renames are as durable as they get.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) throw_os("fsync of directory", dir, err);
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_os("creating directory", dir, ec.value());
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw_os("renaming to", to, errno);
}

bool exchange_paths(const std::string& a, const std::string& b) {
  if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) {
    return true;
  }
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw_os("exchanging with", b, errno);
}

void remove_tree_quietly(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace tandem::detail
