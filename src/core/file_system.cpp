// POSIX implementations of tandem::fs (include/tandem/core/file_system.h).

#include "tandem/core/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <memory>

#include "tandem/core/error.h"

namespace tandem::fs {
namespace {

[[noreturn]] void throw_os(const char* what, const std::string& path, int err) {
  throw Error(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
}

void throw_if(const std::error_code& ec, const char* what, const std::string& path) {
  if (ec) throw_os(what, path, ec.value());
}

std::error_code os_error(int err) { return {err, std::generic_category()}; }

bool stat_mode(const std::string& path, mode_t* mode) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  *mode = st.st_mode;
  return true;
}

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

// Removes everything inside the directory open as `dir_fd` (which this
// function takes over), walking with *at() calls so that no symbolic link
// is followed and long paths never need to be built.
int remove_contents(int dir_fd) {
  std::unique_ptr<DIR, DirCloser> dir(::fdopendir(dir_fd));
  if (!dir) {
    const int err = errno;
    ::close(dir_fd);
    return err;
  }
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = ::readdir(dir.get())) {
    if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) {
      names.emplace_back(entry->d_name);
    }
  }
  if (errno != 0) return errno;
  const int fd = ::dirfd(dir.get());
  for (const std::string& name : names) {
    if (::unlinkat(fd, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) return errno;
    const int child = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child < 0) return errno;
    if (const int err = remove_contents(child)) return err;
    if (::unlinkat(fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return errno;
  }
  return 0;
}

}  // namespace

bool exists(const std::string& path) noexcept {
  mode_t mode = 0;
  return stat_mode(path, &mode);
}

bool is_directory(const std::string& path) noexcept {
  mode_t mode = 0;
  return stat_mode(path, &mode) && S_ISDIR(mode);
}

bool is_regular_file(const std::string& path) noexcept {
  mode_t mode = 0;
  return stat_mode(path, &mode) && S_ISREG(mode);
}

bool is_empty_directory(const std::string& path) noexcept {
  std::error_code ec;
  const std::vector<std::string> names = list_directory(path, ec);
  return !ec && names.empty();
}

std::vector<std::string> list_directory(const std::string& dir, std::error_code& ec) noexcept {
  ec.clear();
  std::vector<std::string> names;
  try {
    std::unique_ptr<DIR, DirCloser> handle(::opendir(dir.c_str()));
    if (!handle) {
      ec = os_error(errno);
      return {};
    }
    errno = 0;
    while (const dirent* entry = ::readdir(handle.get())) {
      if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) {
        names.emplace_back(entry->d_name);
      }
    }
    if (errno != 0) {
      ec = os_error(errno);
      return {};
    }
    std::sort(names.begin(), names.end());
  } catch (const std::bad_alloc&) {
    ec = os_error(ENOMEM);
    return {};
  }
  return names;
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names = list_directory(dir, ec);
  throw_if(ec, "listing directory", dir);
  return names;
}

void create_directories(const std::string& dir, std::error_code& ec) noexcept {
  ec.clear();
  if (dir.empty()) return;
  // Each prefix ending before a '/', then the whole path.
  for (std::size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = dir.substr(0, end);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      ec = os_error(errno);
      return;
    }
    if (end == std::string::npos) break;
  }
  if (!is_directory(dir)) ec = os_error(ENOTDIR);
}

void create_directories(const std::string& dir) {
  std::error_code ec;
  create_directories(dir, ec);
  throw_if(ec, "creating directory", dir);
}

void remove_all(const std::string& path, std::error_code& ec) noexcept {
  ec.clear();
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return;
  if (errno != EISDIR && errno != EPERM) {
    ec = os_error(errno);
    return;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    ec = os_error(errno);
    return;
  }
  if (const int err = remove_contents(fd)) {
    ec = os_error(err);
    return;
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) ec = os_error(errno);
}

void remove_all(const std::string& path) {
  std::error_code ec;
  remove_all(path, ec);
  throw_if(ec, "removing", path);
}

void remove(const std::string& path) {
  if (::remove(path.c_str()) != 0 && errno != ENOENT) throw_os("removing", path, errno);
}

int write_all(int fd, const void* data, std::size_t size) noexcept {
  const char* bytes = static_cast<const char*>(data);
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

void rename(const std::string& from, const std::string& to, std::error_code& ec) noexcept {
  ec.clear();
  if (::rename(from.c_str(), to.c_str()) != 0) ec = os_error(errno);
}

void rename(const std::string& from, const std::string& to) {
  std::error_code ec;
  rename(from, to, ec);
  throw_if(ec, "renaming to", to);
}

std::string current_directory() {
  std::string buffer(PATH_MAX, '\0');
  while (::getcwd(buffer.data(), buffer.size()) == nullptr) {
    if (errno != ERANGE) throw_os("reading", "the working directory", errno);
    buffer.resize(buffer.size() * 2);
  }
  buffer.resize(std::strlen(buffer.c_str()));
  return buffer;
}

void change_directory(const std::string& dir) {
  if (::chdir(dir.c_str()) != 0) throw_os("changing the working directory to", dir, errno);
}

std::string absolute(const std::string& path) {
  // path's member functions live in libstdc++ alone (not among the
  // operations LibTorch 2.11 exports), so the lexical work can use them.
  std::filesystem::path p(path);
  if (p.is_relative()) p = std::filesystem::path(current_directory()) / p;
  return p.lexically_normal().string();
}

}  // namespace tandem::fs
